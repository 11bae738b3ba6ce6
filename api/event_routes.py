"""The control API's event stream, ``GET /events``: server-sent events (state
transitions, operation phases, release samples), kept alive while idle, ended by the
daemon's exit or by a token rotation.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from sglang_supervisor.redact import redact
from sglang_supervisor_api.auth import ApiAccess
from sglang_supervisor_api.responses import EventStreamResponse
from sglang_supervisor_api.routes import SupervisorDep

router = APIRouter()


#: A comment line on an idle event stream this often, so proxies and clients see it alive.
KEEP_ALIVE_S = 15.0


async def _next_event(
    queue: asyncio.Queue[dict[str, Any]], stops: set[asyncio.Future[Any]], timeout_s: float
) -> dict[str, Any] | None:
    """The next event; None after ``timeout_s`` or when one of ``stops`` is done.

    The read is never left pending: a client that disconnects cancels this wait, and a
    ``queue.get()`` left behind would be destroyed pending ("Task was destroyed but it
    is pending!") once its queue is dropped."""
    get = asyncio.ensure_future(queue.get())
    try:
        await asyncio.wait({get, *stops}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not get.done():
            get.cancel()
    if get.done() and not get.cancelled():
        return get.result()
    return None


@router.get(
    "/events",
    response_class=EventStreamResponse,
    responses={200: {"description": "server-sent events; `event:` is the kind, `data:` JSON"}},
)
async def events(
    request: Request,
    sup: SupervisorDep,
    replay: Annotated[bool, Query(description="first send the recent history")] = False,
) -> EventStreamResponse:
    """Server-sent events: state transitions, operation phases, release samples."""

    closing: asyncio.Event = request.app.state.closing
    access: ApiAccess = request.app.state.access
    # The token generation this stream was authorised under: a SIGHUP that rotates the
    # token ends it (the old token must not keep reading the daemon's events).
    generation = access.generation

    async def stream() -> AsyncIterator[str]:
        yield ": sglang-supervisor events\n\n"
        stop = asyncio.ensure_future(closing.wait())
        rotated = access.rotation()
        try:
            with sup.events.subscription(replay=replay) as queue:
                while (
                    not closing.is_set()
                    and access.generation == generation
                    and not await request.is_disconnected()
                ):
                    event = await _next_event(queue, {stop, rotated}, KEEP_ALIVE_S)
                    if event is None:
                        if not closing.is_set() and access.generation == generation:
                            yield ": keep-alive\n\n"
                        continue
                    yield f"event: {event['kind']}\ndata: {json.dumps(redact(event))}\n\n"
        finally:
            stop.cancel()
            rotated.cancel()

    return EventStreamResponse(stream(), headers={"Cache-Control": "no-cache"})
