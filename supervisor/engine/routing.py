"""The operations' steps that keep an sglang-router in step with the server.

Before a serving server is stopped: take it out of the router (``router_remove``), then
drain it — wait until it has no running or queued request, bounded by ``[router]
drain_timeout_s`` — so no client request is cut. After a new server is ready (and, for
an apply, has passed probation): add it and wait until the router lists it healthy
(``router_add``). Without ``[router] url`` these steps do nothing and add no phase.
The drain itself (``drain``) is here too: an apply drains without a router when asked.

A router that does not answer never blocks a stop: ``router_remove`` fails (its phase
says why) and the stop goes on. A failed ``router_add`` is reported in its phase and in
``/status`` (``router.error``); an apply rolls back on it (the new server would serve no
one), and the other operations end with the server running but not in the router.
"""

from __future__ import annotations

import asyncio
import logging

from sglang_supervisor.engine.boundaries import SHUTDOWN_REASON, Cancelled, checkpoint
from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ServerRecord
from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.observe.telemetry import parse_metrics
from sglang_supervisor.operations import FAILED, SUCCEEDED, Operation
from sglang_supervisor.phases import PhaseName
from sglang_supervisor.sglang.router import RouterError
from sglang_supervisor.states import ServerState

log = logging.getLogger("supervisor")
S = ServerState


async def leave(parts: Parts, record: ServerRecord, op: Operation, *, prefix: str = "") -> bool:
    """Take the server out of the router. True when it is out (or was never in)."""
    if not parts.router.enabled:
        return True
    ph = op.phase(prefix + PhaseName.ROUTER_REMOVE)
    try:
        detail = await parts.router.leave()
    except RouterError as exc:
        record.router_answered(str(exc))
        log.warning("router: %s", exc)
        ph.end(FAILED, f"{exc}; stopping anyway")
        return False
    record.router_answered(None)
    ph.end(SUCCEEDED, detail)
    return True


async def join(
    parts: Parts, record: ServerRecord, op: Operation, *, prefix: str = ""
) -> str | None:
    """Add the ready server and wait until the router lists it healthy. Returns None when
    it is, else what went wrong (also in the phase and /status)."""
    if not parts.router.enabled:
        return None
    ph = op.phase(prefix + PhaseName.ROUTER_ADD)
    try:
        detail = await parts.router.join()
    except RouterError as exc:
        why = f"the router did not take the new server: {exc}"
        record.router_answered(why)
        log.warning("router: %s", exc)
        ph.end(FAILED, why)
        return why
    record.router_answered(None)
    ph.end(SUCCEEDED, detail)
    return None


def drain_bound(parts: Parts, asked_s: float) -> float:
    """How long the drain before a stop may last: what the operator asked for, and with a
    router at least ``[router] drain_timeout_s`` (the router sends no new request)."""
    if parts.router.enabled:
        return max(asked_s, parts.settings.router.drain_timeout_s)
    return asked_s


async def leave_and_drain(
    parts: Parts, record: ServerRecord, stop: StopRequest, op: Operation
) -> None:
    """Before the operator's stop or restart of a serving server: out of the router, then
    drained. A server that is not ready is only taken out (best effort)."""
    if not parts.router.enabled:
        return
    serving = record.state == S.READY
    # Still in a router that does not answer, it would keep getting requests: no drain.
    if await leave(parts, record, op) and serving:
        await drain(parts, record, stop, op, parts.settings.router.drain_timeout_s)


async def drain(
    parts: Parts, record: ServerRecord, stop: StopRequest, op: Operation, timeout_s: float
) -> None:
    """ready -> draining until no request runs or waits, or ``timeout_s`` passes.

    An operator's cancel and a forced shutdown end it at the next poll (``Cancelled``);
    a graceful shutdown lets it finish (it is bounded), then the stop follows."""
    ph = op.phase(PhaseName.DRAIN)
    record.transition(S.DRAINING, f"drain up to {timeout_s:.0f}s ({op.id})")
    started = parts.clock()
    deadline = started + timeout_s
    stop.drain_deadline = deadline
    pending: float | None = None
    poll_s = parts.settings.router.drain_poll_s if parts.router.enabled else 0.25
    try:
        while parts.clock() < deadline:
            if stop.forced:
                raise Cancelled(f"{SHUTDOWN_REASON} (forced: drain skipped)", shutdown=True)
            if op.cancel_requested is not None:
                checkpoint(stop, op)
            text = await parts.health.metrics_text(parts.url, 2.0)
            if text is not None:
                t = parse_metrics(text)
                pending = (t.running_requests or 0) + (t.queued_requests or 0)
                if pending == 0:
                    ph.end(SUCCEEDED, "no running or queued requests")
                    return
            await asyncio.sleep(max(parts.poll_s, poll_s))
    finally:
        stop.drain_deadline = None
        record.drained(parts.clock() - started, pending)
    left = "an unknown number of" if pending is None else f"{pending:g}"
    ph.end(
        SUCCEEDED,
        f"timed out after {timeout_s:g}s (drain_timeout_s) with {left} requests still "
        "running or queued; stopping anyway",
    )
