"""Rollback and containment: putting the last-good levers back after a failed apply
(``roll_back``, ``start_last_good``), refusing a cancel from then on
(``no_cancel_from_here``), and containing an error nobody expected (``contain``,
``contain_or_fail``, ``fail_state``): never a state with no process behind it.
"""

from __future__ import annotations

import logging

from sglang_supervisor.engine import routing
from sglang_supervisor.engine.boundaries import Cancelled
from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ServerRecord
from sglang_supervisor.engine.release import stop_and_release
from sglang_supervisor.engine.server import launch_until_ready
from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.operations import FAILED, ROLLED_BACK, Operation
from sglang_supervisor.phases import OpKind, PhaseName, PhasePrefix, prefixed
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.states import ServerState

S = ServerState
log = logging.getLogger("supervisor")


def no_cancel_from_here(op: Operation, what: str) -> None:
    """From here on ``op`` puts the last-good levers back: a cancel would tear down the
    server it is starting and leave nothing serving, so it is refused (409), and one
    that arrived just before (right after a failed start) is dropped: rolling back is
    what it asked for."""
    op.not_cancellable = f"{what} has begun (a cancel now would leave nothing serving)"
    if op.cancel_requested is not None:
        op.cancel_requested = None
        op.wake.clear()  # set for the dropped cancel only (a shutdown is seen by its flag)


async def roll_back(
    parts: Parts, record: ServerRecord, stop: StopRequest, op: Operation, reason: str
) -> None:
    """The new levers failed: stop them, release, start the last-good levers (and put
    them back in the router). Not cancellable (``no_cancel_from_here``)."""
    no_cancel_from_here(op, "the rollback to the last-good levers")
    if parts.router.enabled and record.server is not None:
        await routing.leave(parts, record, op, prefix=PhasePrefix.ROLLBACK)
    if not await stop_and_release(
        parts, record, stop, op, "roll back", S.STOPPED, prefix=PhasePrefix.ROLLBACK
    ):
        op.finish(FAILED, f"{reason}; then the failed server could not be released")
        return
    good = record.last_good
    if good is None:
        op.finish(FAILED, f"{reason}; there are no last-good levers to roll back to")
        return
    rollback_start = prefixed(PhasePrefix.ROLLBACK, PhaseName.START)
    if await start_last_good(parts, record, stop, op, good, rollback_start):
        refused = await routing.join(parts, record, op, prefix=PhasePrefix.ROLLBACK)
        record.rolled_back_to(good)  # they serve (a containment may come from other levers)
        op.rollback_reason = reason
        op.levers_effective = good.to_json()
        op.finish(ROLLED_BACK, reason if refused is None else f"{reason}; then {refused}")
        return
    second = op.rollback_reason
    await stop_and_release(
        parts,
        record,
        stop,
        op,
        f"rolling back to the last-good levers failed: {second}",
        S.FAILED,
        prefix=PhasePrefix.CLEANUP,
    )
    op.rollback_reason = reason
    op.finish(FAILED, f"{reason}; rolling back also failed: {second}")


async def start_last_good(
    parts: Parts, record: ServerRecord, stop: StopRequest, op: Operation, good: LeverSet, phase: str
) -> bool:
    """Start the last-good levers; when their launcher was killed by a signal from
    outside (SIGKILL by an operator or the OOM killer: not the levers' fault, they served
    before), clean up and try exactly once more. False when it is still not ready
    (``op.rollback_reason`` says why)."""
    if await launch_until_ready(parts, record, stop, op, good, probation=False, phase=phase):
        return True
    server = record.server
    code = None if server is None else server.handle.returncode
    if code is None or code >= 0 or op.cancelled is not None or stop.requested:
        return False  # its own failure (an exit code), or nobody wants it any more
    first = op.rollback_reason or "the last-good launcher was killed by a signal"
    if not await stop_and_release(
        parts,
        record,
        stop,
        op,
        f"{first}; starting the last-good levers once more",
        S.STOPPED,
        prefix=PhasePrefix.CLEANUP,
    ):
        return False
    if await launch_until_ready(parts, record, stop, op, good, probation=False, phase=phase):
        return True
    op.rollback_reason = f"{op.rollback_reason} (the second try; the first: {first})"
    return False


async def contain(
    parts: Parts, record: ServerRecord, stop: StopRequest, op: Operation, exc: Exception
) -> None:
    """``op`` raised what nobody expected (a bug; an error of a kind no step handles):
    never leave a state with no process behind it. Unless it was a stop, roll back
    (``roll_back``: tear down what is ours, start the last-good levers again, back in
    the router — the error may have come after the drain took the server out of it);
    a stop, or no last-good levers, only tears down (``failed``). A shutdown in
    progress does the teardown itself."""
    why = f"internal error: {type(exc).__name__}: {exc}"
    op.rollback_reason = why
    no_cancel_from_here(op, "the containment of an internal error")
    if stop.requested:
        op.finish(FAILED, why)
        return
    if op.kind != OpKind.STOP and record.last_good is not None:
        await roll_back(parts, record, stop, op, why)
        return
    if not await stop_and_release(
        parts, record, stop, op, why, S.STOPPED, prefix=PhasePrefix.CLEANUP
    ):
        op.finish(FAILED, f"{why}; then the server could not be released")
        return
    op.finish(FAILED, why)


async def contain_or_fail(
    parts: Parts, record: ServerRecord, stop: StopRequest, op: Operation, exc: Exception
) -> None:
    """``contain``; if even that raises, ``failed`` with both reasons (``fail_state``)."""
    try:
        await contain(parts, record, stop, op, exc)
    except Cancelled as cancelled:  # the shutdown tears down what is left
        if not op.finished:
            op.finish(FAILED, str(cancelled))
    except Exception as again:
        log.exception("operation %s (%s): cleaning up after the error failed", op.id, op.kind)
        why = f"internal error: {type(exc).__name__}: {exc}; cleaning up failed: {again}"
        if not op.finished:
            op.finish(FAILED, why)
        fail_state(record, f"{why}; POST /stop, then /start")


def fail_state(record: ServerRecord, why: str) -> None:
    """The last resort when even ``contain`` raised: walk the allowed edges to ``failed``,
    so /status says an operator is needed instead of showing a state nothing backs."""
    path = {
        S.LOADING: S.STOPPING,
        S.STARTING: S.STOPPING,
        S.READY: S.STOPPING,
        S.DRAINING: S.STOPPING,
        S.STOPPED: S.STOPPING,
        S.STOPPING: S.RELEASING,
        S.RELEASING: S.FAILED,
        S.BACKOFF: S.FAILED,
    }
    while record.state != S.FAILED:
        record.transition(path[record.state], why)
