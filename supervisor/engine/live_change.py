"""An apply made only of levers SGLang changes on a running server: validate (done) ->
live -> verify -> commit, the same pid serving throughout, no request cut.

A refusal, a read-back that does not match, a cancel between two mechanisms: the values
already changed are put back live, in reverse order (``rollback_live``), and the apply
ends ``rolled_back`` saying so. When even that fails (the server stopped answering, say),
the last-good levers are restarted (``engine.rollback.roll_back``): never a server whose
values nobody knows. The levers ``/status`` shows change only at the commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from sglang_supervisor.engine import effect, routing
from sglang_supervisor.engine.boundaries import Cancelled, checkpoint
from sglang_supervisor.engine.live_calls import LiveFailed, LiveServer
from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ServerRecord
from sglang_supervisor.engine.rollback import roll_back
from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.engine.transaction import commit, drain_or_cancel
from sglang_supervisor.operations import FAILED, ROLLED_BACK, SUCCEEDED, Operation
from sglang_supervisor.phases import PhaseName, PhasePrefix, prefixed
from sglang_supervisor.sglang.control import ControlError
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.sglang.live import ChangePath, LiveStep
from sglang_supervisor.states import ServerState

S = ServerState


async def apply_live(
    parts: Parts,
    record: ServerRecord,
    stop: StopRequest,
    op: Operation,
    new: LeverSet,
    path: ChangePath,
    drain_s: float,
    guard: bool = False,
) -> None:
    """Change ``path.steps`` on the ready server, read them back, commit ``new``. With
    ``guard`` the commit waits for the measured effect (``engine.effect``): a worse one
    puts the old values back live; without it the effect is measured after the commit."""
    server = record.server
    assert server is not None and path.kind == "live"
    old = server.levers
    await parts.journal.begin_apply(op.id, new, path="live")
    exiting = False
    try:
        # SGLang attaches or detaches a storage backend only with no request in flight:
        # out of the router and drained first, as before a stop.
        quiet = any(s.mechanism == "hicache_storage" for s in path.steps)
        if quiet and not await drain_or_cancel(parts, record, stop, op, drain_s):
            return
        live = LiveServer(parts, server.handle, old)
        before = await _before(live, path.steps)
        done: list[LiveStep] = []
        ph = op.phase(PhaseName.LIVE)
        try:
            said, offsets = [], []
            for step in path.steps:
                checkpoint(stop, op)
                offsets.append(await live.log_offset())
                atomic = step.mechanism == "set_internal_state"
                if not atomic:
                    done.append(step)  # a call that failed halfway is put back too
                said.append(f"{step.describe()}: {await live.set(step.mechanism, step.new)}")
                if atomic:  # SGLang checks every key before it changes any
                    done.append(step)
            ph.end(SUCCEEDED, "; ".join(said) + f" (pid {server.handle.pid})")
            ph = op.phase(PhaseName.VERIFY)
            notes = [
                await live.check(step.mechanism, step.new, offset)
                for step, offset in zip(path.steps, offsets, strict=True)
            ]
            ph.end(SUCCEEDED, "; ".join(notes))
        except (LiveFailed, ControlError, Cancelled) as exc:
            if isinstance(exc, Cancelled) and exc.shutdown:
                ph.end(FAILED, f"interrupted: {exc}")
                raise
            ph.end(FAILED, str(exc))
            await put_back(parts, record, stop, op, live, done, before, str(exc))
            return
        await back_in_service(parts, record, op, quiet)

        async def undo(why: str) -> None:
            await put_back(parts, record, stop, op, live, done, before, why)

        await commit_in_place(
            parts,
            record,
            stop,
            op,
            new,
            guard=guard,
            undo=undo,
            said=f"changed live: pid {server.handle.pid} serves on",
        )
    except asyncio.CancelledError:
        exiting = True
        raise
    finally:
        if not exiting:
            await parts.journal.clear_pending()


async def _before(live: LiveServer, steps: tuple[LiveStep, ...]) -> dict[str, Mapping[str, Any]]:
    """What to put back for each mechanism: the levers' old values, and for the
    scheduler's knobs what the server itself reads now (an unset lever's value is the one
    SGLang resolved at launch)."""
    out: dict[str, Mapping[str, Any]] = {s.mechanism: dict(s.old) for s in steps}
    if "set_internal_state" in out:
        try:
            states = (await live.read("/server_info")).get("internal_states") or [{}]
            now = states[0] if isinstance(states[0], dict) else {}
        except (LiveFailed, ControlError):
            now = {}
        out["set_internal_state"] = {k: now.get(k, v) for k, v in out["set_internal_state"].items()}
    return out


async def put_back(
    parts: Parts,
    record: ServerRecord,
    stop: StopRequest,
    op: Operation,
    live: LiveServer,
    done: list[LiveStep],
    before: Mapping[str, Mapping[str, Any]],
    reason: str,
) -> None:
    """Put the old values back live, newest first (``rollback_live``); failing that, the
    last-good levers are restarted."""
    pid = live.handle.pid
    if not done:  # refused before anything changed
        await back_in_service(parts, record, op, quiet=record.state == S.DRAINING)
        op.rollback_reason = reason
        op.levers_effective = record.levers.to_json()
        op.finish(ROLLED_BACK, f"{reason}; nothing was changed (pid {pid} serves on)")
        return
    ph = op.phase(prefixed(PhasePrefix.ROLLBACK, PhaseName.LIVE))
    try:
        for step in reversed(done):
            old = before[step.mechanism]
            sends_values = step.mechanism in ("set_internal_state", "configure_logging")
            if sends_values and any(v is None for v in old.values()):
                raise LiveFailed(f"{', '.join(old)} had no value SGLang can be sent back")
            offset = await live.log_offset()
            await live.set(step.mechanism, old)
            await live.check(step.mechanism, old, offset)
    except (LiveFailed, ControlError) as exc:
        ph.end(FAILED, f"{exc}; restarting the last-good levers")
        await roll_back(
            parts, record, stop, op, f"{reason}; putting the old values back live failed: {exc}"
        )
        return
    ph.end(SUCCEEDED, f"the old values serve again live on pid {pid}")
    await back_in_service(parts, record, op, quiet=record.state == S.DRAINING)
    op.rollback_reason = reason
    op.levers_effective = record.levers.to_json()
    op.finish(ROLLED_BACK, f"{reason}; the old values were put back live (pid {pid} serves on)")


async def commit_in_place(
    parts: Parts,
    record: ServerRecord,
    stop: StopRequest,
    op: Operation,
    new: LeverSet,
    *,
    guard: bool,
    undo: Callable[[str], Awaitable[None]],
    said: str,
) -> None:
    """The end of a change made in place (live levers, new weights): with the guard, the
    effect's window first and ``undo(why)`` when it is worse; else the effect measured
    after the commit. Then ``new`` is what serves (record, journal, commit), ``said``
    added to the commit's detail."""
    if guard:
        worse = await effect.guarded_window(parts, record, stop, op)
        if worse is not None:
            await undo(worse)
            return
    else:
        effect.begin(parts, op)
    record.changed_in_place(new)
    parts.journal.record_changed_in_place(new)
    await commit(parts, record, op, new)
    op.phases[-1].detail += f"; {said}"


async def back_in_service(parts: Parts, record: ServerRecord, op: Operation, quiet: bool) -> None:
    """After a change in place that drained the server: ready again, back in the router."""
    if record.state == S.DRAINING:
        record.transition(S.READY, f"apply {op.id}: changed in place, serving again")
    if quiet and parts.router.enabled:
        await routing.join(parts, record, op)
