"""An apply's measured effect, on the engine's side (the figures and the verdict:
``observe.effect``).

Without the guard an apply commits as before and its effect is measured after it
(``begin``): the watcher looks at the measurement on each telemetry read (``look``) and
closes it when its window is over, or as ``interrupted`` when another operation began (a
crash's recovery included); the registry's end hook (``operation_ended``) catches one
that began and ended between two reads, and the daemon's exit ends one in progress
(``at_shutdown``). The closed operation is announced (an ``effect`` event) and its record
appended to the history file once more, now with its effect.

With the guard (``[server] effect_guard``, or the request's ``effect_guard``) the effect
is a phase of the apply, between ``router_add`` and ``commit`` (``guarded_window``): the
new server serves — in the router — for the window (once it has filled:
``observe.effect.settle_s``) while the apply still runs (one
operation at a time: nothing else starts meanwhile); a verdict of ``worse`` rolls back to
the last-good levers like a failed probation (``engine.rollback.roll_back``), any other
verdict commits. So the levers /status shows change only at commit, as always, and a
rollback ends, as every rollback does, in the last-good levers serving or ``failed``.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sglang_supervisor.config import Settings
from sglang_supervisor.engine.boundaries import Cancelled, exit_reason, pause
from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ReadRecord
from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.observe.effect import Margins, effect_json, judge, settle_s, window
from sglang_supervisor.operations import FAILED, SUCCEEDED, Operation, wall_iso
from sglang_supervisor.phases import OpKind, PhaseName

log = logging.getLogger("supervisor")

#: The history records being appended (a reference keeps each task alive to its end).
_WRITES: set[asyncio.Task[None]] = set()


def margins(settings: Settings) -> Margins:
    s = settings.server
    return Margins(s.effect_margin, s.effect_load_margin)


def begin(parts: Parts, op: Operation) -> None:
    """``op`` (an apply) commits without the guard: measure its effect from now."""
    window_s = parts.settings.timeouts.effect_window_s
    if op.kind != OpKind.APPLY or window_s <= 0:
        return
    parts.effects.begin(op, parts.history.samples, time.time(), window_s, margins(parts.settings))


def look(parts: Parts, current: Operation | None) -> Operation | None:
    """On each telemetry read: the measurement in progress ends if another operation
    runs (``current``), or is judged once its window is over."""
    meter = parts.effects
    if meter.pending is None:
        return None
    samples = parts.history.samples
    if current is not None and current is not meter.pending.op:
        closed = meter.interrupt(samples, current)
    elif meter.due(time.time()):
        closed = meter.close(samples, time.time())
    else:
        return None
    _announce(parts, closed)
    return closed


def operation_ended(parts: Parts, op: Operation) -> None:
    """The registry's end hook: an operation that ended interrupts a measurement (if it
    began and ended between two telemetry reads the watcher never saw it run)."""
    _announce(parts, parts.effects.operation_ended(op, parts.history.samples))


async def at_shutdown(parts: Parts) -> None:
    """The daemon exits: a measurement in progress ends here, recorded."""
    op = parts.effects.close(parts.history.samples, time.time(), why="the daemon stopped")
    if op is not None:
        _log(op)
        await parts.journal.append_history(op.to_json())


def _announce(parts: Parts, op: Operation | None) -> None:
    if op is None:
        return
    _log(op)
    effect = op.effect or {}
    parts.events.publish(
        "effect", operation=op.id, verdict=effect.get("verdict"), detail=effect.get("detail")
    )
    task = asyncio.get_running_loop().create_task(parts.journal.append_history(op.to_json()))
    _WRITES.add(task)
    task.add_done_callback(_WRITES.discard)


def _log(op: Operation) -> None:
    effect = op.effect or {}
    log.info("apply %s: effect %s: %s", op.id, effect.get("verdict"), effect.get("detail"))


async def guarded_window(
    parts: Parts, record: ReadRecord, stop: StopRequest, op: Operation
) -> str | None:
    """The ``effect`` phase of a guarded apply: the new server serves for the window,
    then its figures are judged against the window before the apply. Returns why to
    roll back (worse; its launcher exited; an operator's cancel), or None to commit.
    Raises ``Cancelled`` on a shutdown."""
    window_s = parts.settings.timeouts.effect_window_s
    m = margins(parts.settings)
    ph = op.phase(PhaseName.EFFECT)
    before = parts.effects.before_window(op, window_s, parts.history.samples)
    settle = settle_s(before, window_s)  # the new server fills first
    start = time.time() + settle
    closes = f"judged at {wall_iso(start + window_s)}; the commit waits for it (effect_guard)"
    op.effect = effect_json(window_s, m, True, before, None, "measuring", closes)
    server = record.server
    deadline = parts.clock() + settle + window_s
    why: str | None = None
    try:
        while (left := deadline - parts.clock()) > 0:
            await pause(stop, op, min(left, parts.poll_s * 5))
            if server is not None and server.handle.poll():
                why = await exit_reason(server.handle, "during its effect window")
                break
    except Cancelled as exc:
        if exc.shutdown:
            ph.end(FAILED, f"interrupted: {exc}")
            raise
        why = f"{exc} during the effect window"
    after = window(parts.history.samples, start, max(start, time.time()))
    effect = op.effect
    if why is not None:
        effect.update(after=after, verdict="interrupted", detail=f"{why}; not judged")
        parts.effects.judged(op)
        ph.end(FAILED, why)
        return why
    verdict, detail, changes = judge(before, after, m)
    effect.update(after=after, verdict=verdict, detail=detail, changes=changes)
    parts.effects.judged(op)
    _log(op)
    if verdict == "worse":
        why = f"its effect was worse than before the change: {detail} (effect_guard)"
        ph.end(FAILED, why)
        return why
    ph.end(SUCCEEDED, f"{verdict}: {detail}")
    return None
