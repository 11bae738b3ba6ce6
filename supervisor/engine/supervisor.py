"""The Supervisor: the facade the API drives, and the one place the state changes (its
operations are kept by ``registry``).

Everything runs on one asyncio loop; whatever blocks (signals and waits on processes,
GPU probing, disk writes) runs in a worker thread, so the API stays responsive. Exactly
one operation runs at a time (``Busy`` otherwise). Readers take a frozen ``view()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sglang_supervisor.config import Settings, instance_tag_prefix
from sglang_supervisor.engine import checks, operator_requests, rollback, startup, transaction
from sglang_supervisor.engine.desired import DesiredLevers, reconcile
from sglang_supervisor.engine.journal import Journal
from sglang_supervisor.engine.plan_inputs import PlanInputs, plan_inputs
from sglang_supervisor.engine.registry import OperationRegistry
from sglang_supervisor.engine.release import teardown_budget
from sglang_supervisor.engine.server import ServerInfo
from sglang_supervisor.engine.sglang_info import SglangInfo
from sglang_supervisor.engine.sglang_info import before_start as sglang_before_start
from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.engine.view import MembersCache, SupervisorView, gpu_status, snapshot
from sglang_supervisor.engine.watch import Watcher
from sglang_supervisor.host.backend import Backend, ProcessOps
from sglang_supervisor.host.gpu import GpuInfo, GpuSample
from sglang_supervisor.observe.events import EventBus
from sglang_supervisor.observe.health import HealthChecker
from sglang_supervisor.observe.telemetry import Throughput
from sglang_supervisor.operations import Operation
from sglang_supervisor.phases import OpKind
from sglang_supervisor.sglang.levers import LeverSet, canonical_names
from sglang_supervisor.sglang.parser import LoadedSchema
from sglang_supervisor.sglang.resolution import default_resolver
from sglang_supervisor.sglang.router import NoRouter, WorkerLink
from sglang_supervisor.sglang.schema import FlagSchema
from sglang_supervisor.states import ServerState, check_transition
from sglang_supervisor.store import Store

log = logging.getLogger("supervisor")
S = ServerState

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
        router: WorkerLink | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.probe = backend.probe
        self.procs = procs
        self.health = health
        self.schema = schema
        #: Reads the live schema from settings.server.python at start (None: keep ``schema``).
        self.schema_loader = schema_loader
        self.journal = Journal(store, self.warn)
        self.clock = clock
        self.poll_s = poll_s
        self.events = EventBus()
        self.on_transition: list[TransitionHook] = []
        self.ops = OperationRegistry(self.events, self.journal, self._contain)

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
        self.warnings: list[str] = []
        #: Whether SGLang's own parser (in settings.server.python) validates levers too.
        self.schema_live = False
        #: Why SGLang's own parser is not used (None when it is).
        self.schema_warning: str | None = None
        #: Which SGLang answers validation, and whether its resolution runs (/status).
        self.sglang: SglangInfo = sglang_before_start()
        #: Start-up's check of that SGLang (its resolution helper imports it: seconds).
        self.sglang_check: asyncio.Task[None] | None = None
        #: What start-up is still loading (``startup.prepare``), for /status and the
        #: 503 of mutating calls meanwhile; None once the levers to start with are known.
        self.loading: str | None = "the state directory, SGLang's flag schema, the GPUs"
        self.tag_prefix = instance_tag_prefix(settings)
        self.watch = Watcher(self)
        #: A shutdown asked for (graceful, then forced) and the drain's deadline: what
        #: the steps read to end early, apart from the state.
        self.stop_request = StopRequest()
        self._started = False
        self._shutdown_task: asyncio.Future[bool] | None = None
        #: The member pids /status showed last (on the loop only; see view.MembersCache).
        self.members_cache = MembersCache()
        #: The sglang-router in front of the server (``NoRouter`` without [router] url).
        self.router: WorkerLink = router or NoRouter()
        #: What the last router call that failed said (None after one that worked).
        self.router_error: str | None = None
        #: The last drain before a stop: how long it took and how many requests were
        #: still running or queued at its end (None: unknown or no drain yet).
        self.last_drain_s: float | None = None
        self.last_drain_left: float | None = None
        #: While a new server is on probation: ``{"until", "probes_ok", "pid"}`` (None:
        #: not on probation). /readyz answers 503 meanwhile.
        self.probation: dict[str, Any] | None = None
        self.desired = DesiredLevers()  # when the config's levers were read, last reconcile

    # --------------------------------------------------------- the operations

    @property
    def operation(self) -> Operation | None:
        """The running operation (None: none runs)."""
        return self.ops.current

    @property
    def operations(self) -> dict[str, Operation]:
        """The kept operations by id, oldest first."""
        return self.ops.kept

    @property
    def on_operation_end(self) -> list[Callable[[Operation], None]]:
        """Hooks called with each operation that ends (the metrics' histograms)."""
        return self.ops.on_end

    def _begin(self, kind: OpKind, requested: LeverSet | None) -> Operation:
        return self.ops.begin(kind, requested, closing=self.stop_request.requested)

    # ------------------------------------------------------------------ states

    def transition(self, new: ServerState, reason: str) -> None:
        """The one place the state changes: checked, stamped, logged, published."""
        old = self.state
        check_transition(old, new, reason)
        self.state = new
        self.members_cache.drop()  # membership changes with the state
        self.state_since = self.clock()
        self.state_reason = reason
        log.info("%s -> %s (%s)", old, new, reason)
        for hook in self.on_transition:
            hook(old, new, reason)
        self.events.publish("transition", old=str(old), new=str(new), reason=reason)

    def warn(self, message: str) -> None:
        """Show ``message`` in /status's warnings (once)."""
        if message not in self.warnings:
            self.warnings.append(message)

    @property
    def url(self) -> str:
        s = self.settings.server
        host = f"[{s.host}]" if ":" in s.host else s.host
        return f"http://{host}:{s.port}"

    @property
    def store(self) -> Store:
        return self.journal.store

    def gpu_indices(self) -> list[int]:
        return [g.index for g in self.managed]

    # --------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Resolve the GPUs, clear leftovers of ours, measure baselines, launch.

        Returns once the initial start operation runs (``operation``). Raises
        ``ValueError`` (bad config: unknown GPU, invalid initial levers) before anything
        is started. After ``request_shutdown()`` it starts nothing.
        """
        await startup.prepare(self)
        if self.stop_request.requested:
            return
        self._started = True
        self.watch.start()
        op = self._begin(OpKind.START, None)
        self.ops.run(op, startup.initial_start(self, op))

    @property
    def shutdown_requested(self) -> bool:
        """A shutdown was asked for (read-only: ``request_shutdown`` asks)."""
        return self.stop_request.requested

    @property
    def shutdown_forced(self) -> bool:
        """The shutdown is forced: no drain, SIGKILL without a grace period."""
        return self.stop_request.forced

    def teardown_budget_s(self) -> float:
        """The longest a shutdown may take: the rest of a drain in progress (unless
        forced), grace + kill wait + release (pinned memory)."""
        return teardown_budget(self)

    def request_shutdown(self, *, force: bool = False) -> None:
        """Ask for a shutdown; returns at once (call it from a signal handler on the loop).

        The first request is graceful: no operation starts any more, the running one
        ends at its next phase boundary (a drain in progress runs to its end; a spawn,
        teardown or release wait in progress is never interrupted), then ``shutdown()``
        stops the server. A second request (or ``force``) forces: a drain ends at its
        next poll and the server gets SIGKILL without a grace period; GPU release is
        still verified.
        """
        if self.stop_request.request(force=force):
            log.warning("shutdown forced: no drain, SIGKILL without a grace period")
        op = self.operation
        if op is not None:
            op.wake.set()

    async def shutdown(self, *, keep_server: bool = False, force: bool = False) -> bool:
        """Stop the server (SIGTERM, grace, SIGKILL), verify the GPUs released, stop watching.

        Called on the daemon's exit. The running operation is asked to end at its next
        phase boundary and waited for (a thread-backed step in it finishes first: one
        teardown at a time), so no server of ours runs once this returns. With
        ``keep_server`` (systemd ``KillMode=process``) the server is left running and
        recorded, for the next daemon to adopt: a daemon upgrade costs no model reload.
        ``force`` is a second request (see ``request_shutdown``). Returns False when the
        GPUs could not be verified released. A supervisor that never started touches
        nothing. Idempotent: every call returns the first call's result.
        """
        if not self.stop_request.requested or force:
            self.request_shutdown(force=force)
        if self._shutdown_task is None:
            self._shutdown_task = asyncio.ensure_future(self._shutdown(keep_server))
        return await asyncio.shield(self._shutdown_task)

    async def _shutdown(self, keep_server: bool) -> bool:
        try:
            if not self._started:
                return True
            task = self.ops.task
            if task is not None and not task.done():
                await asyncio.wait({task})  # ends at its next phase boundary
            await self.watch.stop()
            op = Operation(kind=OpKind.SHUTDOWN)
            if not keep_server:
                self.ops.keep(op)
            return await transaction.shut_down(self, op, keep_server=keep_server)
        finally:
            await self.health.aclose()
            await self.router.aclose()
            self.probe.close()
            # SGLang's warm resolution helpers (server.python): nothing of ours outlives
            # the daemon, not even for the seconds a helper takes to notice EOF.
            await asyncio.to_thread(default_resolver().close)
            if self.sglang_check is not None:
                # Its helper is closed: the check ends at once (said as degraded).
                with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                    await asyncio.wait_for(self.sglang_check, 5)

    # -------------------------------------------------------------- operations

    async def _contain(self, op: Operation, exc: Exception) -> None:
        await rollback.contain_or_fail(self, op, exc)

    def on_crash(self, kind: str, reason: str) -> None:
        """The watcher saw the ready server exit (``crash``) or stop answering (``hung``)."""
        if self.operation is not None or self.stop_request.requested or self.state != S.READY:
            return
        self.restarts_by_reason[kind] = self.restarts_by_reason.get(kind, 0) + 1
        log.warning("server %s: %s", kind, reason)
        op = self._begin(OpKind.RECOVER, self.levers)
        op.rollback_reason = reason
        self.ops.run(op, transaction.recover(self, op, reason))

    def get_operation(self, op_id: str) -> Operation | None:
        """A kept operation (the last ``MAX_OPERATIONS``), running or finished."""
        return self.ops.kept.get(op_id)

    def request_cancel(self, op_id: str) -> Operation:
        """Ask operation ``op_id`` to end at its next phase boundary; returns it at once.

        A readiness wait, probation, backoff or drain notices it at its next poll; a
        spawn, teardown or release wait in progress finishes first. What follows: an
        apply that has not stopped the old server yet leaves it serving (rolled_back);
        one whose new server is starting tears it down and starts the last-good levers
        (rolled_back); a start, restart or recovery tears down what it started (failed).
        A stop cannot be undone and runs to its end. Once a rollback or containment
        has begun, a cancel could only tear down the last-good server being started:
        ``NotCancellable`` (HTTP 409) says so. Asking twice is asking once.
        Raises ``NoSuchOperation`` (unknown id) or ``OperationFinished`` (already ended).
        """
        return operator_requests.request_cancel(self, op_id)

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
        force_restart: bool = False,
        without_router: bool = False,
    ) -> Operation:
        """Validate and preflight a lever change (with ``[router]``: the router answers,
        unless ``without_router``), then run it as an operation.

        The levers the ready server already serves change nothing: the operation
        succeeds at once and the server is not touched, unless ``force_restart``.
        With ``without_router`` a router that does not take the new server does not roll
        the apply back. Raises ``LeverError`` (nothing touched) or ``Busy``. With
        ``dry_run`` the returned operation is already finished and nothing was touched.
        """
        return await operator_requests.submit_apply(
            self,
            levers,
            env,
            replace=replace,
            dry_run=dry_run,
            drain_timeout_s=drain_timeout_s,
            force_restart=force_restart,
            without_router=without_router,
        )

    async def submit_reconcile(self, trigger: str, dry_run: bool, drain_s: float) -> Operation:
        """The config's levers as one apply (``desired.reconcile``); LeverError, Busy."""
        return await reconcile(self, trigger=trigger, dry_run=dry_run, drain_timeout_s=drain_s)

    def submit_stop(self) -> Operation:
        """Stop the server and verify its GPUs released; it stays stopped (across daemon
        restarts too) until an operator starts it. Raises ``Busy``."""
        operator_requests.preempt_backoff(self)
        op = self._begin(OpKind.STOP, None)
        self.ops.run(op, transaction.stop(self, op))
        return op

    async def submit_start(self) -> Operation:
        """Start the current levers (nothing to do while a live server is ready; a dead
        launcher's leftovers are cleaned up first). It stops no healthy server, so a
        foreign process on a GPU fails the operation, named, rather than the request.
        Raises ``Busy``."""
        operator_requests.preempt_backoff(self)
        op = self._begin(OpKind.START, self.levers)
        self.ops.run(op, transaction.start(self, op))
        return op

    async def submit_restart(self) -> Operation:
        """Stop, verify release, start the same levers. Preflight runs first, as for an
        apply: ``LeverError`` (the healthy server untouched) or ``Busy``."""
        await checks.before_a_relaunch(self)
        operator_requests.preempt_backoff(self)
        op = self._begin(OpKind.RESTART, self.levers)
        self.ops.run(op, transaction.restart(self, op))
        return op

    # ------------------------------------------------------------------ views

    def view(self) -> SupervisorView:
        """A frozen snapshot for readers (routes, metrics, /plan)."""
        return snapshot(self)

    def plan_inputs(self) -> PlanInputs:
        """What ``POST /plan`` reads of the daemon, frozen now (the one call /plan makes)."""
        return plan_inputs(self)

    def sample_gpus(self) -> list[GpuSample]:
        """The managed GPUs now (blocking: call it from a worker thread).
        Raises ``GpuQueryError``."""
        return self.probe.sample(self.gpu_indices())

    async def gpu_status(self) -> list[dict[str, Any]]:
        """The managed GPUs now, with their processes marked ours or not."""
        return await gpu_status(self)

    async def status(self) -> dict[str, Any]:
        """``GET /status``."""
        view = self.view()
        return view.status_json(await self.gpu_status())
