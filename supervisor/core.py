"""The Supervisor: the state machine, the apply transaction, crash handling, shutdown.

Everything runs on one asyncio loop; whatever blocks (signals and waits on processes,
GPU probing, disk writes) runs in a worker thread, so the API stays responsive. Exactly
one operation runs at a time. Every state change goes through ``_transition``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor import preflight, serverlogs
from supervisor.backend import Backend, ProcessOps, ServerHandle
from supervisor.config import Settings, instance_name
from supervisor.events import EventBus
from supervisor.gpu import (
    GpuInfo,
    GpuQueryError,
    GpuSample,
    cuda_visible_devices,
    resolve_gpus,
    wait_released,
)
from supervisor.health import HealthChecker
from supervisor.levers import (
    LeverError,
    LeverProblem,
    LeverSet,
    canonical_names,
    check_levers,
    render_argv,
)
from supervisor.operations import FAILED, ROLLED_BACK, SUCCEEDED, Operation, wall_iso
from supervisor.process import TeardownReport
from supervisor.schema import FlagSchema
from supervisor.serverenv import server_environ
from supervisor.sglang_parser import (
    LoadedSchema,
    ParserUnavailable,
    check_argv,
    lever_for_message,
)
from supervisor.states import IDLE_STATES, ServerState, check_transition
from supervisor.store import PersistedState, RecordedServer, Store, StoreError
from supervisor.telemetry import Throughput, last_decode_line, parse_metrics, tail_lines

log = logging.getLogger("supervisor")
S = ServerState


class Busy(RuntimeError):
    """Another operation is running (HTTP 409)."""

    def __init__(self, op: Operation) -> None:
        super().__init__(
            f"operation {op.id} ({op.kind}) is running; wait for it (GET /operations/{op.id})"
        )
        self.operation = op


@dataclass
class ServerInfo:
    handle: ServerHandle
    levers: LeverSet
    started_at: str = field(default_factory=wall_iso)
    ready_at: str | None = None
    max_total_num_tokens: int | None = None


class StartFailed(Exception):
    """A launch did not become ready; the message says why (exit status, OOM, timeout)."""


TransitionHook = Callable[[ServerState, ServerState, str], None]


class Supervisor:
    """Owns one SGLang server: its processes, its GPUs, its levers."""

    def __init__(
        self,
        settings: Settings,
        *,
        backend: Backend,
        procs: ProcessOps,
        health: HealthChecker,
        schema: FlagSchema,
        store: Store,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 0.1,
        schema_loader: Callable[[str, Path], LoadedSchema] | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.probe = backend.probe
        self.procs = procs
        self.health = health
        self.schema = schema
        #: Reads the live schema from settings.server.python at start (None: keep ``schema``).
        self.schema_loader = schema_loader
        self.store = store
        self.clock = clock
        self.poll_s = poll_s
        self.events = EventBus()
        self.on_transition: list[TransitionHook] = []
        self.on_operation_end: list[Callable[[Operation], None]] = []
        #: Finished operations by (kind, outcome), for the metrics.
        self.operation_counts: dict[tuple[str, str], int] = {}
        #: Unix time of the last apply that succeeded.
        self.last_apply_success_time: float | None = None

        self.state = S.STOPPED
        self.state_since = clock()
        self.state_reason = "daemon started"
        self.levers = LeverSet()
        self.last_good: LeverSet | None = None
        self.server: ServerInfo | None = None
        self.managed: list[GpuInfo] = []
        self.baseline: dict[int, int] = {}
        self.throughput = Throughput()
        self.restarts = 0
        self.restarts_by_reason: dict[str, int] = {}
        self.crash_times: deque[float] = deque()
        self.operation: Operation | None = None
        #: The last operation that ended (its error explains a failed start, say).
        self.last_operation: Operation | None = None
        self.operations: dict[str, Operation] = {}
        self.warnings: list[str] = []
        #: Whether SGLang's own parser (in settings.server.python) validates levers too.
        self.schema_live = False
        #: Why SGLang's own parser is not used (None when it is).
        self.schema_warning: str | None = None
        self.tag_prefix = f"{instance_name(settings)}."
        self._persisted = PersistedState()
        self._op_task: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: Set by shutdown(): no new operation starts, a second shutdown() returns at once.
        self._closing = False
        self._liveness_failures = 0
        self._members_cache: tuple[float, set[int]] | None = None

    # ------------------------------------------------------------------ states

    def _transition(self, new: ServerState, reason: str) -> None:
        """The one place the state changes: checked, stamped, logged, published."""
        old = self.state
        check_transition(old, new, reason)
        self.state = new
        self._members_cache = None  # membership changes with the state
        self.state_since = self.clock()
        self.state_reason = reason
        log.info("%s -> %s (%s)", old, new, reason)
        for hook in self.on_transition:
            hook(old, new, reason)
        self.events.publish("transition", old=str(old), new=str(new), reason=reason)

    # --------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        s = self.settings.server
        host = f"[{s.host}]" if ":" in s.host else s.host
        return f"http://{host}:{s.port}"

    async def start(self) -> None:
        """Resolve the GPUs, clear leftovers of ours, measure baselines, launch.

        Raises ``ValueError`` (bad config: unknown GPU, invalid initial levers) before
        anything is started.
        """
        self._persisted = await asyncio.to_thread(self.store.load)
        if self._persisted.load_warning:
            self.warnings.append(self._persisted.load_warning)
        if self.schema_loader is not None:
            loaded = await asyncio.to_thread(
                self.schema_loader, self.settings.server.python, self.store.dir / "schema-cache"
            )
            self.schema, self.schema_live = loaded.schema, loaded.live
            self.schema_warning = loaded.warning
            if loaded.warning:
                log.warning("%s", loaded.warning)
                self.warnings.append(loaded.warning)
        self.managed = await asyncio.to_thread(self._resolve, self.settings.server.gpus)
        # Persisted levers were checked against the SGLang of their day: check them again
        # against this one (an upgrade may have renamed a flag).
        self.last_good = self._recheck(self._persisted.last_good, "last-good")
        initial = self.last_good or self._recheck(self._persisted.levers, "persisted")
        if initial is None:
            configured = LeverSet(self.settings.server.levers, self.settings.server.env)
            try:
                initial = check_levers(configured, self.schema)
            except LeverError as exc:
                raise ValueError(f"the configured initial levers are invalid: {exc}") from exc
        self.levers = initial
        if not self.probe.pids_are_local():
            self.warnings.append(
                "GPU process ids come from another PID namespace (a container without the "
                "host's PID namespace): membership by pid is impossible, so release is "
                "decided by GPU memory alone"
            )
        self._tasks = [
            asyncio.create_task(self._watch_exit(), name="watch-exit"),
            asyncio.create_task(self._watch_liveness(), name="watch-liveness"),
            asyncio.create_task(self._watch_telemetry(), name="watch-telemetry"),
        ]
        op = self._begin("start", None)
        self._run(op, self._initial_start(op))

    def _recheck(self, levers: LeverSet | None, what: str) -> LeverSet | None:
        if levers is None:
            return None
        try:
            return check_levers(levers, self.schema)
        except LeverError as exc:
            why = (
                f"the {what} levers in {self.store.dir} do not fit SGLang "
                f"{self.schema.sglang_version} ({exc}); not using them"
            )
            log.error("%s", why)
            self.warnings.append(why)
            return None

    def _resolve(self, names: list[str]) -> list[GpuInfo]:
        """The managed GPUs: those named (index or UUID), or every GPU the probe sees."""
        return resolve_gpus(self.probe, names or [str(d.index) for d in self.probe.devices()])

    async def _initial_start(self, op: Operation) -> None:
        """Adopt the recorded server if it is healthy; else clear leftovers and launch."""
        record = self._persisted.server
        if record is not None and await self._try_adopt(op, record):
            return
        # Leftovers of an earlier daemon (same instance tag) go first, so the baseline is
        # measured with nothing of ours on the GPUs.
        members = await asyncio.to_thread(self._members_now)
        try:
            if members:
                await self._clear_leftovers(op, members)
            await self._measure_baseline()
        except StartFailed as exc:
            op.finish(FAILED, str(exc))
            return
        if await self._refuse_if_foreign(op):
            return
        if self._persisted.pending_operation is not None:
            pending = self._persisted.pending_operation
            op.phase("interrupted_apply").end(
                ROLLED_BACK,
                f"apply {pending.get('id')} was interrupted by the daemon's exit; "
                "starting the last-good levers",
            )
            self._persisted.pending_operation = None
        if not await self._launch_until_ready(op, self.levers, probation=False):
            await self._recover_loop(op, op.rollback_reason or "the initial start failed")
            return
        await self._commit(op, self.levers)

    async def _refuse_if_foreign(self, op: Operation) -> bool:
        """Fail ``op`` (True) when a process that is not ours holds a managed GPU."""
        try:
            foreign = await self._foreign_processes()
        except GpuQueryError as exc:
            why = f"not starting: the managed GPUs cannot be queried: {exc}"
        else:
            if foreign is None:
                return False
            why = (
                f"not starting: {foreign}; stop it or take that GPU out of server.gpus, then "
                "POST /start (a process that is not ours is never killed automatically)"
            )
        log.error("%s", why)
        op.phase("foreign_processes").end(FAILED, why)
        op.finish(FAILED, why)
        return True

    async def _foreign_processes(self) -> str | None:
        """A description of processes that are not ours on the managed GPUs, or None.

        Raises ``GpuQueryError``: a failed query never reads as "no foreign process"."""
        if not self.probe.pids_are_local():
            return None
        samples = await asyncio.to_thread(self.probe.sample, self._indices())
        members = await asyncio.to_thread(self._members_now)
        found = [
            f"pid {p.pid} holds "
            + ("an unknown amount" if p.used_bytes is None else f"{p.used_bytes / 2**30:.1f} GiB")
            + f" on GPU {s.index}"
            for s in samples
            for p in s.processes
            if p.pid not in members
        ]
        return "; ".join(found) or None

    async def _try_adopt(self, op: Operation, record: RecordedServer) -> bool:
        """Keep a server an earlier daemon left running, if it is healthy: no reload.

        Adopted when its launcher (same pid *and* create time) answers /health_generate,
        or is still starting with the last-good levers. A server of an interrupted apply
        that is not ready yet is torn down instead (the last-good levers start).
        """
        handle = await asyncio.to_thread(
            self.procs.adopt, record.pid, record.create_time, record.tag, Path(record.log_path)
        )
        if handle is None:
            return False
        levers = LeverSet.from_json(record.levers)
        probe = await self.health.generate_ok(self.url, 5.0)
        interrupted_apply = self.last_good is not None and levers != self.last_good
        if interrupted_apply and not probe.ok:
            return False
        ph = op.phase("adopt")
        others = await asyncio.to_thread(
            self.procs.members, None, tag=None, tag_prefix=self.tag_prefix, exclude_tag=record.tag
        )
        if others:
            t = self.settings.timeouts
            report = await asyncio.to_thread(
                self.procs.teardown,
                None,
                tag=None,
                tag_prefix=self.tag_prefix,
                exclude_tag=record.tag,
                grace_s=t.stop_grace_s,
                kill_timeout_s=t.kill_timeout_s,
            )
            op.phase("leftovers_stop").end(
                SUCCEEDED if report.clean else FAILED, f"other launches: {report.describe()}"
            )
        if self._persisted.baseline is not None:
            self.baseline = dict(self._persisted.baseline)
        else:
            self.baseline = {g.index: 0 for g in self.managed}
            self.warnings.append(
                "no recorded GPU baseline: release is judged against 0 bytes + tolerance"
            )
        self.server = ServerInfo(handle=handle, levers=levers)
        self.levers = levers
        self._transition(
            S.STARTING,
            f"adopting pid {record.pid} (launch {record.tag}) left running by an earlier daemon",
        )
        try:
            await self._wait_ready(handle)
        except StartFailed as exc:
            ph.end(FAILED, str(exc))
            await self._recover_loop(op, str(exc))
            return True
        ph.end(SUCCEEDED, f"pid {record.pid} adopted: no restart, levers {levers.digest()}")
        if self.last_good is None or interrupted_apply:
            # The interrupted apply had reached ready: finish it.
            await self._commit(op, levers)
        else:
            self._persisted.pending_operation = None
            await self._save_quietly()
            op.levers_effective = levers.to_json()
            op.finish(SUCCEEDED)
        return True

    async def _clear_leftovers(self, op: Operation, members: set[int]) -> None:
        """stopped -> stopping -> releasing -> stopped for processes an earlier daemon left.

        No baseline exists yet, so release here means: no member pid on any managed GPU.
        """
        reason = f"leftover processes of this instance: {sorted(members)}"
        self._transition(S.STOPPING, reason)
        ph = op.phase("leftovers_stop")
        report = await self._teardown_blocking(None)
        ph.end(SUCCEEDED if report.clean else FAILED, report.describe())
        self._transition(S.RELEASING, reason)
        ph = op.phase("leftovers_release")
        known = set(report.members)
        result = await asyncio.to_thread(
            wait_released,
            self.probe,
            self._indices(),
            {g.index: g.memory_total_bytes for g in self.managed},
            lambda: known,
            timeout_s=self._release_timeout(None),
            tolerance_bytes=0,
            consecutive=self.settings.timeouts.release_samples,
        )
        if not result.released or not report.clean:
            why = f"leftovers could not be cleared: {report.describe()}; {result.describe()}"
            ph.end(FAILED, why)
            self._transition(S.FAILED, why)
            raise StartFailed(why)
        ph.end(SUCCEEDED, result.describe())
        if not self.probe.pids_are_local():
            # Without local pids the GPUs cannot tell us the leftovers are gone, and the
            # baseline measured next may include what they held: say so.
            self.warnings.append(
                f"leftovers {sorted(members)} were torn down, but with GPU pids from another "
                "PID namespace their release could not be verified on the GPUs"
            )
        self._transition(S.STOPPED, "leftovers cleared")

    async def _measure_baseline(self) -> None:
        try:
            samples = await asyncio.to_thread(self.probe.sample, self._indices())
        except GpuQueryError as exc:
            raise StartFailed(f"cannot read the managed GPUs: {exc}") from exc
        # Foreign processes count in the baseline: release waits for *our* memory only.
        self.baseline = {s.index: s.memory_used_bytes for s in samples}
        self._persisted.baseline = dict(self.baseline)

    def teardown_budget_s(self) -> float:
        """The longest a shutdown may take: grace + kill wait + release (pinned memory)."""
        t = self.settings.timeouts
        levers = self.server.levers if self.server is not None else None
        return t.stop_grace_s + t.kill_timeout_s + self._release_timeout(levers)

    async def shutdown(self, *, keep_server: bool = False) -> bool:
        """Stop the server (SIGTERM, grace, SIGKILL), verify the GPUs released, stop watching.

        Called on the daemon's SIGTERM/SIGINT. A running operation is cancelled first.
        With ``keep_server`` (systemd ``KillMode=process``) the server is left running and
        recorded, for the next daemon to adopt: a daemon upgrade costs no model reload.
        Returns False when the GPUs could not be verified released. A supervisor that never
        started touches nothing. Idempotent: a second call returns True at once.
        """
        if self._closing:
            return True
        self._closing = True
        try:
            return await self._shutdown(keep_server) if self._tasks else True
        finally:
            await self.health.aclose()
            self.probe.close()

    async def _shutdown(self, keep_server: bool) -> bool:
        for task in self._tasks:
            task.cancel()
        if self._op_task is not None and not self._op_task.done():
            self._op_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._op_task
        if self.operation is not None and not self.operation.finished:
            self.operation.finish(FAILED, "the daemon was shut down during the operation")
            self.operation = None
        released = True
        if keep_server:
            log.info(
                "leaving the server running for the next daemon to adopt (%s)",
                f"pid {self.server.handle.pid}" if self.server is not None else "none running",
            )
        else:
            op = Operation(kind="shutdown")
            self.operations[op.id] = op
            released = await self._stop_and_release(op, "daemon shutdown", S.STOPPED)
            op.finish(SUCCEEDED if released else FAILED, None if released else self.state_reason)
        with contextlib.suppress(StoreError):
            await asyncio.to_thread(self._save)
        return released

    # -------------------------------------------------------------- operations

    def _begin(self, kind: str, requested: LeverSet | None) -> Operation:
        if self._closing:
            raise Busy(Operation(kind="shutdown"))
        current = self.operation
        if current is not None and not current.finished:
            raise Busy(current)
        op = Operation(
            kind=kind, levers_requested=None if requested is None else requested.to_json()
        )
        op.listener = self._publish_phase
        self.operation = op
        self.operations[op.id] = op
        while len(self.operations) > 200:
            self.operations.pop(next(iter(self.operations)))
        self.events.publish("operation", id=op.id, op_kind=kind, state="running")
        return op

    def _publish_phase(self, op: Operation, phase: dict[str, Any]) -> None:
        self.events.publish("phase", operation=op.id, op_kind=op.kind, **phase)

    def _run(self, op: Operation, coro: Any) -> None:
        async def runner() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                if not op.finished:
                    op.finish(FAILED, "cancelled: the daemon is shutting down")
                raise
            except Exception as exc:  # a bug; never leave the operation "running"
                log.exception("operation %s (%s) crashed", op.id, op.kind)
                if not op.finished:
                    op.finish(FAILED, f"internal error: {type(exc).__name__}: {exc}")
            finally:
                if not op.finished:
                    op.finish(SUCCEEDED)
                self._operation_ended(op)
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.store.append_history, op.to_json())
                if self.operation is op:
                    self.operation = None

        self._op_task = asyncio.create_task(runner(), name=f"op-{op.kind}-{op.id}")

    def _operation_ended(self, op: Operation) -> None:
        if op.reported:
            return
        op.reported = True
        self.last_operation = op
        key = (op.kind, op.state)
        self.operation_counts[key] = self.operation_counts.get(key, 0) + 1
        if op.kind == "apply" and op.state == SUCCEEDED:
            self.last_apply_success_time = time.time()
        for hook in self.on_operation_end:
            hook(op)
        self.events.publish("operation", id=op.id, op_kind=op.kind, state=op.state, error=op.error)

    def _preempt_backoff(self) -> None:
        """An operator's request wins over a restart that is only waiting out its backoff."""
        op = self.operation
        if (
            op is not None
            and op.kind == "recover"
            and self.state == S.BACKOFF
            and self._op_task is not None
        ):
            self._op_task.cancel()
            op.finish(FAILED, "superseded by an operator's request during backoff")
            self.operation = None
            self._operation_ended(op)

    async def validate(self, requested: LeverSet) -> tuple[LeverSet, str]:
        """Check a full lever set in two stages; raises ``LeverError`` naming every bad lever.

        (a) the schema: exact names, types, choices, owned flags, the env allowlist;
        (b) SGLang's own ``prepare_server_args`` and its GPU-free cross-field checks, run in
        the server's interpreter (skipped, with a warning in /status, when it has no SGLang).
        Returns the canonical set and a line saying what ran and how long it took.
        """
        t0 = time.monotonic()
        checked = check_levers(requested, self.schema)
        detail = (
            f"schema of SGLang {self.schema.sglang_version}: {(time.monotonic() - t0) * 1e3:.1f} ms"
        )
        if not self.schema_live:
            return checked, detail + "; SGLang's own parser not available"
        try:
            verdict = await asyncio.to_thread(
                check_argv, self.settings.server.python, self._flags(checked)
            )
        except ParserUnavailable as exc:
            problem = LeverProblem("levers", f"cannot run SGLang's parser: {exc}")
            raise LeverError([problem]) from exc
        if not verdict.ok:
            message = verdict.message or "refused"
            lever = lever_for_message(message, self.schema, list(checked.levers))
            what = "parser" if verdict.stage == "parse" else "cross-field checks"
            raise LeverError(
                [
                    LeverProblem(
                        lever, f"SGLang {self.schema.sglang_version}'s {what} refused it: {message}"
                    )
                ]
            )
        detail += f"; SGLang's parser and checks: {verdict.duration_s:.2f} s"
        if verdict.message:
            # Some checks read values only SGLang's start-up resolves (from the model or
            # the GPU): the ones before that ran; say where they stopped.
            detail += f" (cross-field checks stopped early, {verdict.message})"
        return checked, detail

    async def preflight(self, levers: LeverSet) -> list[LeverProblem]:
        """Resource problems of ``levers`` on this host (empty: it can start)."""
        if self.backend.name == "sglang" and not self.schema_live:
            return [
                LeverProblem(
                    "server.python",
                    f"{self.settings.server.python} cannot run SGLang ({self.schema_warning}); "
                    "install SGLang there or fix server.python",
                )
            ]
        samples: list[GpuSample] | None
        try:
            samples = await asyncio.to_thread(self.probe.sample, self._indices())
        except GpuQueryError as exc:
            return [LeverProblem("gpus", f"cannot query the managed GPUs: {exc}")]
        members = await asyncio.to_thread(self._members_now)
        running = self.state not in IDLE_STATES
        freed = 0
        if running and self.server is not None:
            gpu_total = min((g.memory_total_bytes for g in self.managed), default=0)
            freed = preflight.pinned_host_bytes(self.server.levers.levers, gpu_total)
        return await asyncio.to_thread(
            preflight.check,
            levers,
            managed=self.managed,
            samples=samples,
            member_pids=members,
            pids_are_local=self.probe.pids_are_local(),
            host=preflight.host_facts(self.backend.simulated_host_ram_bytes),
            freed_on_stop_bytes=freed,
            server_host=self.settings.server.host,
            server_port=self.settings.server.port,
            port_is_ours=running,
        )

    def requested_levers(
        self, levers: Mapping[str, Any], env: Mapping[str, Any], *, replace: bool = False
    ) -> LeverSet:
        """The set a request asks for: its names made canonical, merged onto the current."""
        return self.levers.merged(canonical_names(levers, self.schema), env, replace=replace)

    async def submit_apply(
        self,
        levers: Mapping[str, Any],
        env: Mapping[str, Any],
        *,
        replace: bool = False,
        dry_run: bool = False,
        drain_timeout_s: float = 0.0,
    ) -> Operation:
        """Validate and preflight a lever change, then run it as an operation.

        Raises ``LeverError`` (nothing touched) or ``Busy``. With ``dry_run`` the returned
        operation is already finished and nothing was touched.
        """
        current = self.operation
        # A restart waiting out its backoff yields to the operator, but only once the
        # request has been found valid (below): a typo must not cancel a recovery.
        waiting_restart = (
            current is not None and current.kind == "recover" and (self.state == S.BACKOFF)
        )
        if not dry_run and current is not None and not current.finished and not waiting_restart:
            raise Busy(current)
        requested = self.requested_levers(levers, env, replace=replace)
        t0 = time.monotonic()
        checked, validate_detail = await self.validate(requested)
        t_validate = time.monotonic() - t0
        problems = await self.preflight(checked)
        t_preflight = time.monotonic() - t0 - t_validate
        if problems:
            raise LeverError(problems)
        if dry_run:
            op = Operation(kind="apply", levers_requested=checked.to_json(), dry_run=True)
            self.operations[op.id] = op
        else:
            self._preempt_backoff()
            op = self._begin("apply", checked)  # Busy if another operation started meanwhile
        for name, detail, took in (
            ("validate", validate_detail, t_validate),
            ("preflight", "GPUs, host RAM, port, model path", t_preflight),
        ):
            ph = op.phase(name)
            ph.duration_s = took
            ph.end(SUCCEEDED, f"{detail} ({took * 1000:.1f} ms)")
        if dry_run:
            diff = self.levers.diff(checked)
            op.levers_effective = self.levers.to_json()
            op.finish(SUCCEEDED)
            op.phases[-1].detail += f"; would change {', '.join(diff) or 'nothing'}"
            return op
        drain = min(max(0.0, drain_timeout_s), self.settings.timeouts.max_drain_s)
        self._run(op, self._apply(op, checked, drain))
        return op

    def submit_stop(self) -> Operation:
        self._preempt_backoff()
        op = self._begin("stop", None)
        self._run(op, self._stop_op(op))
        return op

    def submit_start(self) -> Operation:
        self._preempt_backoff()
        op = self._begin("start", self.levers)
        self._run(op, self._start_op(op))
        return op

    def submit_restart(self) -> Operation:
        self._preempt_backoff()
        op = self._begin("restart", self.levers)
        self._run(op, self._restart_op(op))
        return op

    async def _stop_op(self, op: Operation) -> None:
        if await self._stop_and_release(op, f"operator stop ({op.id})", S.STOPPED):
            op.levers_effective = None
            op.finish(SUCCEEDED)
        else:
            op.finish(FAILED, self.state_reason)

    async def _start_op(self, op: Operation) -> None:
        if self.state == S.READY:
            op.levers_effective = self.levers.to_json()
            op.phase("start").end(SUCCEEDED, "already ready; nothing to do")
            op.finish(SUCCEEDED)
            return
        members = await asyncio.to_thread(self._members_now)
        # From a verified stopped state with nothing of ours left, there is nothing to
        # release (and memory a foreign process holds must not be waited for).
        if (self.state != S.STOPPED or members) and not await self._stop_and_release(
            op, f"clean up before start ({op.id})", S.STOPPED
        ):
            op.finish(FAILED, self.state_reason)
            return
        await self._start_current(op)

    async def _restart_op(self, op: Operation) -> None:
        if not await self._stop_and_release(op, f"operator restart ({op.id})", S.STOPPED):
            op.finish(FAILED, self.state_reason)
            return
        await self._start_current(op)

    async def _start_current(self, op: Operation) -> None:
        """From stopped: the current levers, unless a foreign process holds a GPU. A start
        that fails is cleaned up and the operation fails (an operator asked for it)."""
        if await self._refuse_if_foreign(op):
            return
        if await self._launch_until_ready(op, self.levers, probation=False):
            await self._commit(op, self.levers)
        else:
            await self._stop_and_release(op, f"{op.kind} failed", S.STOPPED, prefix="cleanup_")
            op.finish(FAILED, op.rollback_reason)

    async def _apply(self, op: Operation, new: LeverSet, drain_s: float) -> None:
        """drain -> stop -> release -> start -> (probation) -> commit, or roll back."""
        self._persisted.pending_operation = {"id": op.id, "kind": "apply", "levers": new.to_json()}
        await self._save_quietly()
        if drain_s > 0 and self.state == S.READY:
            await self._drain(op, drain_s)
        if not await self._stop_and_release(op, f"apply {op.id}", S.STOPPED):
            op.finish(FAILED, f"the old server could not be released: {self.state_reason}")
            return
        if await self._launch_until_ready(op, new, probation=True):
            await self._commit(op, new)
            return
        # The new levers failed: roll back to the last good ones.
        reason = op.rollback_reason or "the new levers failed"
        if not await self._stop_and_release(op, "roll back", S.STOPPED, prefix="rollback_"):
            op.finish(FAILED, f"{reason}; then the failed server could not be released")
            return
        if self.last_good is None:
            op.finish(FAILED, f"{reason}; there are no last-good levers to roll back to")
            return
        good = self.last_good
        if await self._launch_until_ready(op, good, probation=False, phase="rollback_start"):
            op.rollback_reason = reason
            op.levers_effective = good.to_json()
            self._persisted.pending_operation = None
            await self._save_quietly()
            op.finish(ROLLED_BACK, reason)
            return
        second = op.rollback_reason
        await self._stop_and_release(
            op,
            f"rolling back to the last-good levers failed: {second}",
            S.FAILED,
            prefix="cleanup_",
        )
        op.rollback_reason = reason
        op.finish(FAILED, f"{reason}; rolling back also failed: {second}")

    async def _commit(self, op: Operation, levers: LeverSet) -> None:
        ph = op.phase("commit")
        if op.kind in ("apply", "start", "restart"):
            # An operator's successful change starts the crash-loop count afresh.
            self.crash_times.clear()
        self.levers = levers
        self.last_good = levers
        self._persisted.levers = levers
        self._persisted.last_good = levers
        self._persisted.pending_operation = None
        op.levers_effective = levers.to_json()
        try:
            await asyncio.to_thread(self._save)
        except StoreError as exc:
            ph.end(FAILED, str(exc))
            op.finish(FAILED, f"the new levers serve, but persisting them failed: {exc}")
            return
        ph.end(SUCCEEDED, f"last-good levers are now {levers.digest()}")
        op.finish(SUCCEEDED)

    async def _drain(self, op: Operation, timeout_s: float) -> None:
        ph = op.phase("drain")
        self._transition(S.DRAINING, f"drain up to {timeout_s:.0f}s ({op.id})")
        deadline = self.clock() + timeout_s
        pending: float | None = None
        while self.clock() < deadline:
            text = await self.health.metrics_text(self.url, 2.0)
            if text is not None:
                t = parse_metrics(text)
                pending = (t.running_requests or 0) + (t.queued_requests or 0)
                if pending == 0:
                    ph.end(SUCCEEDED, "no running or queued requests")
                    return
            await asyncio.sleep(max(self.poll_s, 0.25))
        ph.end(SUCCEEDED, f"timed out after {timeout_s:.0f}s with {pending} requests left")

    # ------------------------------------------------------- stop and release

    def _members_now(self) -> set[int]:
        handle = self.server.handle if self.server is not None else None
        return self.procs.members(handle, tag=None, tag_prefix=self.tag_prefix)

    async def _teardown_blocking(self, handle: ServerHandle | None) -> TeardownReport:
        t = self.settings.timeouts
        return await asyncio.to_thread(
            self.procs.teardown,
            handle,
            tag=None if handle is None else handle.tag,
            tag_prefix=self.tag_prefix,
            grace_s=t.stop_grace_s,
            kill_timeout_s=t.kill_timeout_s,
        )

    def _release_timeout(self, levers: LeverSet | None) -> float:
        t = self.settings.timeouts
        if levers is None:
            return t.release_timeout_s
        gpu_total = min((g.memory_total_bytes for g in self.managed), default=0)
        pinned_gib = preflight.pinned_host_bytes(levers.levers, gpu_total) / 2**30
        return t.release_timeout_s + t.release_s_per_pinned_gib * pinned_gib

    async def _stop_and_release(
        self, op: Operation, reason: str, then: ServerState, prefix: str = ""
    ) -> bool:
        """stopping -> releasing -> ``then`` (or failed). Returns whether GPUs are released.

        SIGTERM to the process group and every member, SIGKILL after ``stop_grace_s``,
        then wait until every managed GPU shows no member and baseline memory.
        """
        if self.state not in (S.STOPPING, S.RELEASING):
            self._transition(S.STOPPING, reason)
        handle = self.server.handle if self.server is not None else None
        levers = self.server.levers if self.server is not None else None
        ph = op.phase(prefix + "stop")
        report = await self._teardown_blocking(handle)
        ph.end(SUCCEEDED if report.clean else FAILED, report.describe())
        self.events.publish("teardown", operation=op.id, **report.to_json())
        if self.state == S.STOPPING:
            self._transition(S.RELEASING, reason)
        ph = op.phase(prefix + "release")
        known = set(report.members)

        def members() -> set[int]:
            return known | {s.pid for s in report.survivors}

        t = self.settings.timeouts
        loop = asyncio.get_running_loop()

        def on_sample(samples: list[GpuSample]) -> None:
            data = [{"index": s.index, "memory_used_bytes": s.memory_used_bytes} for s in samples]
            loop.call_soon_threadsafe(
                lambda: self.events.publish("release_sample", operation=op.id, gpus=data)
            )

        baseline, tolerance = self.baseline, t.release_tolerance_mib * 2**20
        if any(i not in baseline for i in self._indices()):
            # Never measured (the start failed before it could be): judge by member pids
            # alone rather than call a GPU empty against a made-up baseline.
            log.warning("no GPU baseline yet: release is judged by member processes only")
            baseline, tolerance = {g.index: g.memory_total_bytes for g in self.managed}, 0
        result = await asyncio.to_thread(
            wait_released,
            self.probe,
            self._indices(),
            baseline,
            members,
            timeout_s=self._release_timeout(levers),
            tolerance_bytes=tolerance,
            consecutive=t.release_samples,
            interval_s=t.release_interval_s,
            on_sample=on_sample,
        )
        self.server = None
        self._persisted.server = None
        await self._save_quietly()
        if result.released:
            ph.end(SUCCEEDED, result.describe())
            self._transition(then, f"{reason}: GPUs released")
            return True
        why = result.describe()
        if report.survivors:
            why += "; still alive: " + "; ".join(s.describe() for s in report.survivors)
        foreign = sorted({p for g in result.gpus for p in g.foreign_pids})
        if foreign:
            why += f"; processes not ours on the GPUs: {foreign} (never killed automatically)"
        ph.end(FAILED, why)
        self._transition(S.FAILED, why)
        return False

    # ---------------------------------------------------------------- launch

    def _indices(self) -> list[int]:
        return [g.index for g in self.managed]

    def _flags(self, levers: LeverSet) -> list[str]:
        """The server's flags: the levers, then the ones the supervisor owns."""
        s = self.settings.server
        owned = ["--host", s.host, "--port", str(s.port), "--enable-metrics"]
        return [*render_argv(levers, self.schema), *owned]

    def _argv(self, levers: LeverSet) -> list[str]:
        return [*self.backend.command, *self._flags(levers)]

    def _env(self, levers: LeverSet) -> dict[str, str]:
        env = server_environ(os.environ, self.settings.state_dir)
        env.update(self.backend.env)
        env.update(levers.env)
        env.update(cuda_visible_devices(self.managed)[1])
        return env

    async def _launch_until_ready(
        self, op: Operation, levers: LeverSet, *, probation: bool, phase: str = "start"
    ) -> bool:
        """starting -> ready (+ probation). On failure the server is left for the caller
        to tear down, and ``op.rollback_reason`` / ``op.log_tail`` say why."""
        ph = op.phase(phase)
        tag = f"{self.tag_prefix}{uuid.uuid4().hex[:12]}"
        # Microseconds in the name keep launches in order even within one second.
        now = time.time()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f".{int(now % 1 * 1e6):06d}"
        log_path = self.store.logs_dir / f"server-{stamp}-{tag.rsplit('.', 1)[-1]}.log"
        self._transition(S.STARTING, f"{op.kind} {op.id}: levers {levers.digest()}")
        self.levers = levers
        await asyncio.to_thread(
            serverlogs.prune, self.store.logs_dir, self.settings.server.log_keep_launches - 1
        )
        try:
            handle = await asyncio.to_thread(
                self.procs.spawn, self._argv(levers), self._env(levers), tag=tag, log_path=log_path
            )
        except OSError as exc:
            op.rollback_reason = str(exc)
            ph.end(FAILED, str(exc))
            return False
        self.server = ServerInfo(handle=handle, levers=levers)
        self._persisted.server = RecordedServer(
            handle.pid, handle.create_time, tag, str(log_path), levers.to_json()
        )
        self._persisted.levers = levers
        await self._save_quietly()
        self.events.publish("launch", operation=op.id, pid=handle.pid, tag=tag, log=str(log_path))
        try:
            await self._wait_ready(handle)
            ph.end(SUCCEEDED, f"pid {handle.pid} ready")
            if probation and self.settings.timeouts.probation_s > 0:
                ph = op.phase("probation")
                await self._probation(handle)
                ph.end(SUCCEEDED, f"pid {handle.pid} still serving")
        except StartFailed as exc:
            op.rollback_reason = str(exc)
            op.log_tail = await asyncio.to_thread(tail_lines, log_path, 30)
            ph.end(FAILED, str(exc))
            return False
        return True

    async def _wait_ready(self, handle: ServerHandle) -> None:
        t = self.settings.timeouts
        t0 = self.clock()
        deadline = t0 + t.ready_timeout_s
        while True:
            if handle.poll():
                raise StartFailed(await self._exit_reason(handle, "during start"))
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise StartFailed(
                    f"not ready after {t.ready_timeout_s:g}s (ready_timeout_s): "
                    f"/health_generate never answered 200; pid {handle.pid} was still running"
                )
            probe = await self.health.generate_ok(self.url, min(5.0, max(0.5, remaining)))
            if probe.ok:
                break
            # Probing often keeps the lag between "ready" and noticing it short; after the
            # first 10 s (a real model load takes minutes) a tenth of the rate is enough.
            interval = t.readiness_poll_s if self.clock() - t0 < 10 else t.readiness_poll_s * 10
            await asyncio.sleep(min(interval, self.poll_s * 5))
        info: dict[str, Any] = {}
        with contextlib.suppress(Exception):
            info = await self.health.server_info(self.url, 5.0)
        assert self.server is not None
        self.server.ready_at = wall_iso()
        tokens = info.get("max_total_num_tokens")
        self.server.max_total_num_tokens = int(tokens) if isinstance(tokens, (int, float)) else None
        self._liveness_failures = 0
        self._transition(
            S.READY, f"pid {handle.pid} answered /health_generate after {self.clock() - t0:.1f}s"
        )

    async def _probation(self, handle: ServerHandle) -> None:
        deadline = self.clock() + self.settings.timeouts.probation_s
        while True:
            if handle.poll():
                raise StartFailed(await self._exit_reason(handle, "within the probation window"))
            if self.clock() >= deadline:
                return
            await asyncio.sleep(self.poll_s)

    async def _exit_reason(self, handle: ServerHandle, when: str) -> str:
        why = f"the server (pid {handle.pid}) {handle.describe_exit()} {when}"
        tail = await asyncio.to_thread(tail_lines, handle.log_path, 60)
        text = "\n".join(tail).lower()
        if "out of memory" in text or "outofmemoryerror" in text:
            why += (
                "; its log reports CUDA out of memory: lower mem_fraction_static "
                "(or max_running_requests / chunked_prefill_size)"
            )
        elif "error: unrecognized arguments" in text or "error: argument" in text:
            line = next((ln for ln in reversed(tail) if "error:" in ln), "")
            why += f"; it rejected its arguments: {line.strip()}"
        return why

    # ------------------------------------------------------------ crash path

    async def _recover_loop(self, op: Operation, reason: str) -> None:
        """Release, back off, relaunch the same levers; crash loop -> failed."""
        t = self.settings.timeouts
        while True:
            now = self.clock()
            self.crash_times.append(now)
            while self.crash_times and self.crash_times[0] < now - t.crash_loop_window_s:
                self.crash_times.popleft()
            if self.state != S.BACKOFF and not await self._stop_and_release(op, reason, S.BACKOFF):
                op.finish(FAILED, self.state_reason)
                return
            crashes = len(self.crash_times)
            if crashes >= t.crash_loop_count:
                why = (
                    f"crash loop: {crashes} failures within {t.crash_loop_window_s:.0f}s, the "
                    f"last: {reason}; fix the cause, then POST /start or /levers"
                )
                self._transition(S.FAILED, why)
                op.finish(FAILED, why)
                return
            delay = min(t.backoff_max_s, t.backoff_initial_s * 2 ** max(0, crashes - 1))
            ph = op.phase("backoff")
            await asyncio.sleep(delay)
            ph.end(SUCCEEDED, f"waited {delay:.1f}s after: {reason}")
            if await self._launch_until_ready(op, self.levers, probation=False):
                if op.kind == "recover":
                    self.restarts += 1
                # Serving again with these levers proves them good (and gives a first
                # start that needed retries its last-good set).
                await self._commit(op, self.levers)
                return
            reason = op.rollback_reason or "restart failed"

    def _on_crash(self, kind: str, reason: str) -> None:
        if self.operation is not None or self._closing or self.state != S.READY:
            return
        self.restarts_by_reason[kind] = self.restarts_by_reason.get(kind, 0) + 1
        log.warning("server %s: %s", kind, reason)
        op = self._begin("recover", self.levers)
        op.rollback_reason = reason
        self._run(op, self._recover_loop(op, reason))

    async def _watch_exit(self) -> None:
        while True:
            # A crash is noticed within 0.25 s by default; cheaper than polling at poll_s.
            await asyncio.sleep(self.poll_s * 2.5)
            server = self.server
            if server is None or self.operation is not None or self.state != S.READY:
                continue
            if server.handle.poll():
                self._on_crash("crash", await self._exit_reason(server.handle, "while ready"))

    async def _watch_liveness(self) -> None:
        t = self.settings.timeouts
        while True:
            await asyncio.sleep(t.liveness_interval_s)
            if self.operation is not None or self.state != S.READY or self.server is None:
                self._liveness_failures = 0
                continue
            probe = await self.health.generate_ok(self.url, t.liveness_timeout_s)
            if probe.ok or self.operation is not None or self.state != S.READY:
                self._liveness_failures = 0
                continue
            self._liveness_failures += 1
            log.warning(
                "liveness probe %d/%d failed: %s",
                self._liveness_failures,
                t.liveness_failures,
                probe.detail,
            )
            if self._liveness_failures >= t.liveness_failures:
                self._liveness_failures = 0
                self._on_crash(
                    "hung",
                    f"hung: {t.liveness_failures} consecutive liveness probes failed "
                    f"(last: {probe.detail})",
                )

    async def _watch_telemetry(self, interval_s: float = 2.0) -> None:
        while True:
            await asyncio.sleep(interval_s)
            server = self.server
            if server is None:
                self.throughput = Throughput()  # no server, no load: never show a stale one
                continue
            await asyncio.to_thread(
                serverlogs.bound_size,
                server.handle.log_path,
                self.settings.server.log_max_mib * 2**20,
            )
            if self.state not in (S.READY, S.DRAINING):
                continue
            text = await self.health.metrics_text(self.url, 2.0)
            if text is not None:
                with contextlib.suppress(ValueError):
                    self.throughput = parse_metrics(text)
                    continue
            fallback = await asyncio.to_thread(last_decode_line, server.handle.log_path)
            if fallback is not None:
                self.throughput = fallback

    # --------------------------------------------------------------- queries

    def _save(self) -> None:
        self.store.save(self._persisted)

    async def _save_quietly(self) -> None:
        try:
            await asyncio.to_thread(self._save)
        except StoreError as exc:
            log.error("%s", exc)
            if str(exc) not in self.warnings:
                self.warnings.append(str(exc))

    def _members_cached(self, max_age_s: float = 1.0) -> set[int]:
        """Members for display (/status): a full /proc scan costs milliseconds, so one scan
        serves every request within ``max_age_s``. Teardown never uses this."""
        now = self.clock()
        cached = self._members_cache
        if cached is None or now - cached[0] > max_age_s:
            cached = (now, self._members_now())
            self._members_cache = cached
        return cached[1]

    async def gpu_status(self) -> list[dict[str, Any]]:
        try:
            samples = await asyncio.to_thread(self.probe.sample, self._indices())
            members = await asyncio.to_thread(self._members_cached)
        except GpuQueryError as exc:
            return [{"index": g.index, "uuid": g.uuid, "error": str(exc)} for g in self.managed]
        return [
            {
                "index": s.index,
                "uuid": s.uuid,
                "name": s.name,
                "memory_used_bytes": s.memory_used_bytes,
                "memory_total_bytes": s.memory_total_bytes,
                "baseline_bytes": self.baseline.get(s.index),
                "processes": [
                    {"pid": p.pid, "used_bytes": p.used_bytes, "member": p.pid in members}
                    for p in s.processes
                ],
            }
            for s in samples
        ]

    async def status(self) -> dict[str, Any]:
        server = self.server
        return {
            "state": str(self.state),
            "state_reason": self.state_reason,
            "state_for_s": round(self.clock() - self.state_since, 3),
            "backend": self.backend.name,
            "server": None
            if server is None
            else {
                "pid": server.handle.pid,
                "url": self.url,
                "started_at": server.started_at,
                "ready_at": server.ready_at,
                "max_total_num_tokens": server.max_total_num_tokens,
                "launch_tag": server.handle.tag,
                "log_path": str(server.handle.log_path),
            },
            "levers": dict(self.levers.levers),
            "env": dict(self.levers.env),
            "last_good_levers": None if self.last_good is None else self.last_good.to_json(),
            "gpus": await self.gpu_status(),
            "gpu_probe": {"kind": self.probe.kind, "pids_are_local": self.probe.pids_are_local()},
            "operation": None if self.operation is None else self.operation.to_json(),
            "last_operation": None
            if self.last_operation is None
            else {
                k: self.last_operation.to_json()[k]
                for k in ("id", "kind", "state", "error", "ended_at")
            },
            "restarts": self.restarts,
            "restarts_by_reason": dict(self.restarts_by_reason),
            "throughput": self.throughput.to_json(),
            "schema": {"sglang_version": self.schema.sglang_version, "source": self.schema.source},
            "warnings": list(self.warnings),
        }
