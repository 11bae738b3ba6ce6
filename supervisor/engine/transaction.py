"""The operations, as functions that read top to bottom: apply, stop, start, restart, and
the supervisor's own recovery of a crashed or hung server.

Each step is named after its phase. After the stop, every path ends in the new server,
the last-good levers serving again (``rolled_back``: ``engine.rollback``), or a named
``failed``. A shutdown or an operator's cancel is honoured between steps (``checkpoint``),
never inside one.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sglang_supervisor.engine import effect, routing
from sglang_supervisor.engine.boundaries import Cancelled, checkpoint, pause
from sglang_supervisor.engine.checks import refuse_if_foreign
from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ReadRecord, ServerRecord
from sglang_supervisor.engine.release import members_now, stop_and_release
from sglang_supervisor.engine.rollback import roll_back
from sglang_supervisor.engine.routing import drain
from sglang_supervisor.engine.server import launch_until_ready
from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.engine.warmup import warm_page_cache
from sglang_supervisor.operations import FAILED, ROLLED_BACK, SUCCEEDED, Operation
from sglang_supervisor.phases import OPERATOR_LAUNCHES, OpKind, PhaseName, PhasePrefix
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.states import ServerState
from sglang_supervisor.store import StoreError

S = ServerState
log = logging.getLogger("supervisor")


async def apply(
    parts: Parts,
    record: ServerRecord,
    stop: StopRequest,
    op: Operation,
    new: LeverSet,
    drain_s: float,
    *,
    without_router: bool = False,
    guard: bool = False,
) -> None:
    """journal -> drain -> stop and release -> launch with probation -> commit, or roll
    back to the last-good levers. Validation and preflight ran before (nothing stopped).
    With ``without_router`` a failed ``router_add`` is reported, not rolled back. With
    ``guard`` the commit waits for the measured effect (a worse one rolls back);
    without it the effect is measured after the commit (``engine.effect``)."""
    await parts.journal.begin_apply(op.id, new)
    exiting = False
    try:
        if not await drain_or_cancel(parts, record, stop, op, drain_s, new):
            return
        if not await stop_and_release(parts, record, stop, op, f"apply {op.id}", S.STOPPED):
            op.finish(FAILED, f"the old server could not be released: {record.state_reason}")
            return
        if await launch_until_ready(parts, record, stop, op, new, probation=True):
            refused = await routing.join(parts, record, op)
            if refused is None or without_router:
                worse = await effect.guarded_window(parts, record, stop, op) if guard else None
                if worse is None:
                    if not guard:
                        effect.begin(parts, op)
                    await commit(parts, record, op, new)
                    if refused is not None:  # the operator chose to go on without the router
                        op.phases[-1].detail += f"; outside the router (without_router): {refused}"
                    return
                refused = worse
            op.rollback_reason = refused
        await roll_back(parts, record, stop, op, op.rollback_reason or "the new levers failed")
    except asyncio.CancelledError:
        exiting = True  # the event loop is going away with the process
        raise
    finally:
        # Whatever the outcome, the apply is no longer pending. A daemon that dies in the
        # middle never gets here, and its successor reports the interrupted apply.
        if not exiting:
            await parts.journal.clear_pending()


async def keep_serving(record: ReadRecord, op: Operation) -> None:
    """An apply of exactly the levers the ready server serves: nothing to change, so
    nothing is stopped (``force_restart`` in the request restarts it anyway)."""
    server = record.server
    pid = "?" if server is None else server.handle.pid
    op.levers_effective = record.levers.to_json()
    op.phase(PhaseName.COMMIT).end(
        SUCCEEDED,
        f"nothing changed: pid {pid} already serves levers {record.levers.digest()}; not "
        "restarted (force_restart: true restarts it)",
    )
    op.finish(SUCCEEDED)


async def drain_or_cancel(
    parts: Parts,
    record: ServerRecord,
    stop: StopRequest,
    op: Operation,
    drain_s: float,
    new: LeverSet | None = None,
) -> bool:
    """The last steps before the stop: ``new``'s weight files into the page cache
    while the old server serves (``engine.warmup``), out of the router (with [router]),
    then drain when asked or when the router was left. An operator's cancel up to here
    stops nothing: the old server serves on (``rolled_back``), back in the router, and
    this returns False."""
    left = False
    try:
        if new is not None and record.state == S.READY:
            await warm_page_cache(parts, record, stop, op, new)
        if record.state == S.READY and parts.router.enabled:
            left = await routing.leave(parts, record, op)
            if left:  # still in a router that does not answer: it would never drain
                drain_s = routing.drain_bound(parts, drain_s)
        if drain_s > 0 and record.state == S.READY:
            await drain(parts, record, stop, op, drain_s)
        checkpoint(stop, op)
    except Cancelled as exc:
        if exc.shutdown:
            raise
        if record.state == S.DRAINING:
            record.transition(S.READY, f"apply {op.id} cancelled during its drain")
        if left and record.state == S.READY:
            await routing.join(parts, record, op)
        op.rollback_reason = str(exc)
        op.levers_effective = record.levers.to_json()
        outcome = ROLLED_BACK if record.state == S.READY else FAILED
        op.finish(outcome, f"{exc}; nothing was stopped")
        return False
    return True


async def commit(parts: Parts, record: ServerRecord, op: Operation, levers: LeverSet) -> None:
    """``levers`` serve (and passed probation where there was one): they become current
    and last-good, persisted."""
    ph = op.phase(PhaseName.COMMIT)
    if op.kind in OPERATOR_LAUNCHES:
        # An operator's successful change starts the crash-loop count afresh.
        record.crashes_forgiven()
    record.commit_levers(levers)
    op.levers_effective = levers.to_json()
    try:
        await parts.journal.commit(levers)
    except StoreError as exc:
        ph.end(FAILED, str(exc))
        op.finish(FAILED, f"the new levers serve, but persisting them failed: {exc}")
        return
    ph.end(SUCCEEDED, f"last-good levers are now {levers.digest()}")
    op.finish(SUCCEEDED)


async def stop(parts: Parts, record: ServerRecord, stop: StopRequest, op: Operation) -> None:
    """An operator's stop: out of the router and drained (with [router]), tear down,
    verify release, stay stopped (and out of the router).

    The intent is recorded first: a daemon that dies in the middle of the stop leaves
    the server stopped (its successor finishes the teardown instead of adopting it)."""
    await parts.journal.record_operator_stop(op.id)  # stays stopped across daemon restarts
    await routing.leave_and_drain(parts, record, stop, op)
    if await stop_and_release(parts, record, stop, op, f"operator stop ({op.id})", S.STOPPED):
        op.levers_effective = None
        op.finish(SUCCEEDED)
    else:
        op.finish(FAILED, record.state_reason)


async def start(parts: Parts, record: ServerRecord, stop: StopRequest, op: Operation) -> None:
    """An operator's start: from stopped (or failed, after cleaning up), the current levers."""
    server = record.server
    if record.state == S.READY and server is not None and not server.handle.poll():
        op.levers_effective = record.levers.to_json()
        op.phase(PhaseName.START).end(SUCCEEDED, "already ready; nothing to do")
        op.finish(SUCCEEDED)
        return
    # A launcher that died before the watcher noticed is cleaned up like any leftover.
    members = await asyncio.to_thread(members_now, parts, record)
    # From a verified stopped state with nothing of ours left, there is nothing to
    # release (and memory a foreign process holds must not be waited for).
    if (record.state != S.STOPPED or members) and not await stop_and_release(
        parts, record, stop, op, f"clean up before start ({op.id})", S.STOPPED
    ):
        op.finish(FAILED, record.state_reason)
        return
    await start_current(parts, record, stop, op)


async def restart(parts: Parts, record: ServerRecord, stop: StopRequest, op: Operation) -> None:
    """An operator's restart: out of the router and drained (with [router]), stop,
    verify release, start the same levers, back in the router."""
    await routing.leave_and_drain(parts, record, stop, op)
    if not await stop_and_release(
        parts, record, stop, op, f"operator restart ({op.id})", S.STOPPED
    ):
        op.finish(FAILED, record.state_reason)
        return
    await start_current(parts, record, stop, op)


async def start_current(
    parts: Parts, record: ServerRecord, stop: StopRequest, op: Operation
) -> None:
    """From stopped: the current levers, unless a foreign process holds a GPU. A start
    that fails (or is cancelled) is cleaned up and the operation fails."""
    checkpoint(stop, op)
    if await refuse_if_foreign(parts, record, op):
        return
    if await launch_until_ready(parts, record, stop, op, record.levers, probation=False):
        await routing.join(parts, record, op)
        await commit(parts, record, op, record.levers)
    else:
        await stop_and_release(
            parts, record, stop, op, f"{op.kind} failed", S.STOPPED, prefix=PhasePrefix.CLEANUP
        )
        op.finish(FAILED, op.rollback_reason)


async def recover(
    parts: Parts, record: ServerRecord, stop: StopRequest, op: Operation, reason: str
) -> None:
    """Release, back off, relaunch the same levers; a crash loop ends in failed."""
    t = parts.settings.timeouts
    while True:
        crashes = record.note_crash(parts.clock(), t.crash_loop_window_s)
        parts.journal.record_crashes(*record.crash_history(parts.clock(), time.time()))
        if record.state != S.BACKOFF and record.server is not None:
            # Crashed or hung: out of the router first (a dead server's removal never
            # waits on the server; a router that does not answer is reported, not awaited).
            await routing.leave(parts, record, op)
        if record.state != S.BACKOFF and not await stop_and_release(
            parts, record, stop, op, reason, S.BACKOFF
        ):
            op.finish(FAILED, record.state_reason)
            return
        if crashes >= t.crash_loop_count:
            why = (
                f"crash loop: {crashes} failures within {t.crash_loop_window_s:.0f}s, the "
                f"last: {reason}; fix the cause, then POST /start or /levers"
            )
            record.transition(S.FAILED, why)
            op.finish(FAILED, why)
            return
        delay = min(t.backoff_max_s, t.backoff_initial_s * 2 ** max(0, crashes - 1))
        ph = op.phase(PhaseName.BACKOFF)
        try:
            await pause(stop, op, delay)
        except Cancelled as exc:
            if exc.shutdown:
                raise
            why = f"{exc} during the backoff after: {reason}; POST /start to start again"
            record.transition(S.FAILED, why)
            op.finish(FAILED, why)
            return
        ph.end(SUCCEEDED, f"waited {delay:.1f}s after: {reason}")
        if await launch_until_ready(parts, record, stop, op, record.levers, probation=False):
            await routing.join(parts, record, op)
            if op.kind == OpKind.RECOVER:
                record.recovered()
                parts.journal.record_crashes(*record.crash_history(parts.clock(), time.time()))
            # Serving again with these levers proves them good (and gives a first
            # start that needed retries its last-good set).
            await commit(parts, record, op, record.levers)
            return
        reason = op.rollback_reason or "restart failed"
        if op.cancelled is not None:
            await stop_and_release(
                parts, record, stop, op, reason, S.STOPPED, prefix=PhasePrefix.CLEANUP
            )
            op.finish(FAILED, reason)
            return


async def shut_down(
    parts: Parts, record: ServerRecord, stop: StopRequest, op: Operation, *, keep_server: bool
) -> bool:
    """The daemon's exit, once no other operation runs: stop the server and verify the
    GPUs released (False when they could not be), or with ``keep_server`` leave it
    running and recorded for the next daemon to adopt."""
    released = True
    if keep_server:
        log.info(
            "leaving the server running for the next daemon to adopt (%s)",
            f"pid {record.server.handle.pid}" if record.server is not None else "none running",
        )
    else:
        await routing.leave(parts, record, op)
        released = await stop_and_release(parts, record, stop, op, "daemon shutdown", S.STOPPED)
        op.finish(SUCCEEDED if released else FAILED, None if released else record.state_reason)
    await parts.journal.flush()
    return released
