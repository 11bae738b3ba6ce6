"""The Supervisor: the facade the API drives. It builds the steps' collaborators
(``Parts``), the server record (``ServerRecord``: the one writer of the server's facts)
and the shutdown request (``StopRequest``), and hands them to each step; its operations
are kept by ``registry``.

Everything runs on one asyncio loop; whatever blocks (signals and waits on processes,
GPU probing, disk writes) runs in a worker thread, so the API stays responsive. Exactly
one operation runs at a time (``Busy`` otherwise). Readers take a frozen ``view()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from sglang_supervisor.config import ServerSettings, Settings, instance_tag_prefix
from sglang_supervisor.engine import (
    checks,
    effect,
    operator_requests,
    rollback,
    start_retry,
    startup,
    transaction,
)
from sglang_supervisor.engine.desired import DesiredLevers, reconcile
from sglang_supervisor.engine.facade import SupervisorReads
from sglang_supervisor.engine.journal import Journal
from sglang_supervisor.engine.parts import Learned, Parts, SchemaLoader
from sglang_supervisor.engine.plan_inputs import PlanInputs, plan_inputs
from sglang_supervisor.engine.record import ServerRecord
from sglang_supervisor.engine.registry import OperationRegistry
from sglang_supervisor.engine.release import teardown_budget
from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.engine.view import MembersCache, SupervisorView, gpu_status, snapshot
from sglang_supervisor.engine.watch import Watcher
from sglang_supervisor.host.backend import Backend, ProcessOps
from sglang_supervisor.host.gpu import GpuSample, latest_samples
from sglang_supervisor.observe.effect import EffectMeter
from sglang_supervisor.observe.events import EventBus
from sglang_supervisor.observe.health import HealthChecker
from sglang_supervisor.observe.history import LoadHistory
from sglang_supervisor.operations import Operation
from sglang_supervisor.phases import OpKind
from sglang_supervisor.planner.diagnosis import Diagnoser
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.sglang.resolution import default_resolver
from sglang_supervisor.sglang.router import NoRouter, WorkerLink
from sglang_supervisor.sglang.schema import FlagSchema
from sglang_supervisor.states import ServerState
from sglang_supervisor.store import Store

log = logging.getLogger("supervisor")
S = ServerState


class Supervisor(SupervisorReads):
    """Owns one SGLang server: its processes, its GPUs, its levers.

    ``parts`` (fixed), ``record`` (the server's changing facts, written by its own
    methods only) and ``stop_request`` are what the steps take; ``SupervisorReads``
    gives readers read-only properties over them."""

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
        schema_loader: SchemaLoader | None = None,
        router: WorkerLink | None = None,
    ) -> None:
        events = EventBus()
        #: The member pids /status showed last (on the loop only; see view.MembersCache).
        self.members_cache = MembersCache()
        self.record = ServerRecord(clock, events, on_change=self.members_cache.drop)
        self.parts = Parts(
            settings=settings,
            backend=backend,
            procs=procs,
            health=health,
            journal=Journal(store, self.record.warn),
            router=router or NoRouter(),
            events=events,
            clock=clock,
            poll_s=poll_s,
            tag_prefix=instance_tag_prefix(settings),
            learned=Learned(schema),
            schema_loader=schema_loader,
            history=LoadHistory(),
            # Read at each sample: a SIGHUP replaces settings.timeouts (api/reload.py).
            diagnoser=Diagnoser(lambda: settings.timeouts.diagnosis_hold_s, clock=clock),
            desired=DesiredLevers(settings.server),
            effects=EffectMeter(),
        )
        self.ops = OperationRegistry(events, self.parts.journal, self._contain)
        # Another operation's end interrupts an effect being measured (engine/effect.py).
        self.ops.on_end.append(lambda op: effect.operation_ended(self.parts, op))
        self.watch = Watcher(self.parts, self.record, self.ops, self.on_crash)
        #: Start-up's retries of its own start, refused by a process not ours on a GPU.
        self._start_retry: asyncio.Task[None] | None = None
        #: A shutdown asked for (graceful, then forced) and the drain's deadline: what
        #: the steps read to end early, apart from the state.
        self.stop_request = StopRequest()
        #: Start-up's check of that SGLang (its resolution helper imports it: seconds).
        self.sglang_check: asyncio.Task[None] | None = None
        self._started = False
        self._shutdown_task: asyncio.Future[bool] | None = None

    # --------------------------------------------------------- the operations

    def warn(self, message: str) -> None:
        """Show ``message`` in /status's warnings (once): ``ServerRecord.warn``."""
        self.record.warn(message)

    def warning_resolved(self, message: str) -> None:
        """Take ``message`` out of /status's warnings: what it warned of is over."""
        self.record.warning_resolved(message)

    def _begin(self, kind: OpKind, requested: LeverSet | None) -> Operation:
        return self.ops.begin(kind, requested, closing=self.stop_request.requested)

    # --------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Resolve the GPUs, clear leftovers of ours, measure baselines, launch.

        Returns once the initial start operation runs (``operation``). Raises
        ``ValueError`` (bad config: unknown GPU, invalid initial levers) before anything
        is started. After ``request_shutdown()`` it starts nothing.
        """
        self.sglang_check = await startup.prepare(self.parts, self.record, self.stop_request)
        if self.stop_request.requested:
            return
        self._started = True
        self.watch.start()
        op = self._begin(OpKind.START, None)
        self.ops.run(op, self._initial_start(op))

    async def _initial_start(self, op: Operation) -> None:
        await startup.initial_start(self.parts, self.record, self.stop_request, op)
        if self.record.refused_start is not None:  # a process not ours on a managed GPU
            self._start_retry = asyncio.create_task(
                start_retry.retry_refused_start(
                    self.parts, self.record, self.stop_request, self.submit_start
                ),
                name="start-retry",
            )

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
        return teardown_budget(self.parts, self.record, self.stop_request)

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
            await effect.at_shutdown(self.parts)  # an effect being measured: interrupted
            if self._start_retry is not None:
                self._start_retry.cancel()
            op = Operation(kind=OpKind.SHUTDOWN)
            if not keep_server:
                self.ops.keep(op)
            return await transaction.shut_down(
                self.parts, self.record, self.stop_request, op, keep_server=keep_server
            )
        finally:
            await self.health.aclose()
            await self.parts.control.aclose()
            await self.router.aclose()
            # The slurm launcher's probe ends its per-node presence step (seconds at most).
            await asyncio.to_thread(self.probe.close)
            # SGLang's warm resolution helpers (server.python): nothing of ours outlives
            # the daemon, not even for the seconds a helper takes to notice EOF.
            await asyncio.to_thread(default_resolver().close)
            if self.sglang_check is not None:
                # Its helper is closed: the check ends at once (said as degraded).
                with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                    await asyncio.wait_for(self.sglang_check, 5)

    # -------------------------------------------------------------- operations

    async def _contain(self, op: Operation, exc: Exception) -> None:
        await rollback.contain_or_fail(self.parts, self.record, self.stop_request, op, exc)

    def on_crash(self, kind: str, reason: str) -> None:
        """The watcher saw the ready server exit (``crash``) or stop answering (``hung``)."""
        if self.operation is not None or self.stop_request.requested or self.state != S.READY:
            return
        self.record.crash_seen(kind)
        log.warning("server %s: %s", kind, reason)
        op = self._begin(OpKind.RECOVER, self.levers)
        op.rollback_reason = reason
        self.ops.run(
            op, transaction.recover(self.parts, self.record, self.stop_request, op, reason)
        )

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
        return operator_requests.request_cancel(self.events, self.ops, op_id)

    def requested_levers(
        self, levers: Mapping[str, Any], env: Mapping[str, Any], *, replace: bool = False
    ) -> LeverSet:
        """The set a request asks for: its names made canonical, merged onto the current."""
        return operator_requests.requested_levers(
            self.schema, self.levers, levers, env, replace=replace
        )

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
        effect_guard: bool | None = None,
    ) -> Operation:
        """Validate and preflight a lever change (with ``[router]``: the router answers,
        unless ``without_router``), then run it as an operation.

        With ``effect_guard`` (None: ``[server] effect_guard``) the commit waits for the
        change's measured effect and a worse one rolls back (``engine.effect``).

        The levers the ready server already serves change nothing: the operation
        succeeds at once and the server is not touched, unless ``force_restart``.
        With ``without_router`` a router that does not take the new server does not roll
        the apply back. Raises ``LeverError`` (nothing touched) or ``Busy``. With
        ``dry_run`` the returned operation is already finished and nothing was touched.
        """
        return await operator_requests.submit_apply(
            self.parts,
            self.record,
            self.stop_request,
            self.ops,
            levers,
            env,
            replace=replace,
            dry_run=dry_run,
            drain_timeout_s=drain_timeout_s,
            force_restart=force_restart,
            without_router=without_router,
            effect_guard=effect_guard,
        )

    def take_config(self, server: ServerSettings) -> list[str]:
        """Make a re-read config's levers the desired state (SIGHUP, ``POST /reconcile``);
        returns what changed. Nothing is applied here (``submit_reconcile`` applies)."""
        return self.parts.desired.take(server)

    async def submit_reconcile(self, trigger: str, dry_run: bool, drain_s: float) -> Operation:
        """The config's levers as one apply with ``replace`` (``desired.reconcile``): no
        restart when nothing differs. Raises ``LeverError`` or ``Busy``, both recorded in
        /status's ``levers_config.last_reconcile``."""

        async def submit(config: LeverSet) -> Operation:
            return await self.submit_apply(
                config.levers, config.env, replace=True, dry_run=dry_run, drain_timeout_s=drain_s
            )

        desired = self.parts.desired
        return await reconcile(desired, self.record, submit, trigger=trigger, dry_run=dry_run)

    def submit_stop(self) -> Operation:
        """Stop the server and verify its GPUs released; it stays stopped (across daemon
        restarts too) until an operator starts it. Raises ``Busy``."""
        operator_requests.preempt_backoff(self.ops, self.record)
        op = self._begin(OpKind.STOP, None)
        self.ops.run(op, transaction.stop(self.parts, self.record, self.stop_request, op))
        return op

    async def submit_start(self) -> Operation:
        """Start the current levers (nothing to do while a live server is ready; a dead
        launcher's leftovers are cleaned up first). It stops no healthy server, so a
        foreign process on a GPU fails the operation, named, rather than the request.
        Raises ``Busy``."""
        operator_requests.preempt_backoff(self.ops, self.record)
        op = self._begin(OpKind.START, self.levers)
        self.ops.run(op, transaction.start(self.parts, self.record, self.stop_request, op))
        return op

    async def submit_restart(self) -> Operation:
        """Stop, verify release, start the same levers. Preflight runs first, as for an
        apply: ``LeverError`` (the healthy server untouched) or ``Busy``."""
        await checks.before_a_relaunch(self.parts, self.record, self.stop_request, self.operation)
        operator_requests.preempt_backoff(self.ops, self.record)
        op = self._begin(OpKind.RESTART, self.levers)
        self.ops.run(op, transaction.restart(self.parts, self.record, self.stop_request, op))
        return op

    # ------------------------------------------------------------------ views

    def view(self) -> SupervisorView:
        """A frozen snapshot for readers (routes, metrics, /plan)."""
        return snapshot(self.parts, self.record, self.ops)

    def plan_inputs(self) -> PlanInputs:
        """What ``POST /plan`` reads of the daemon, frozen now (the one call /plan makes)."""
        return plan_inputs(self.parts, self.record, self.view())

    def sample_gpus(self) -> list[GpuSample]:
        """The managed GPUs now (blocking: call it from a worker thread); under a probe
        across Slurm nodes, each node's last sample (a scrape never waits on a node).
        Raises ``GpuQueryError``."""
        return latest_samples(self.parts.probe, self.record.gpu_indices())

    async def gpu_status(self) -> list[dict[str, Any]]:
        """The managed GPUs now, with their processes marked ours or not."""
        return await gpu_status(self.parts, self.record, self.members_cache)

    async def status(self) -> dict[str, Any]:
        """``GET /status``."""
        view = self.view()
        return view.status_json(await self.gpu_status())
