"""The control API's event stream, ``GET /events``: server-sent events (state
transitions, operation phases, release samples), kept alive while idle, ended by the
daemon's exit or by a token rotation.

The wire is sse-starlette's (``EventSourceResponse``): its keep-alive comment every
``KEEP_ALIVE_S``, its watch for the client's disconnect (which cancels the stream's
generator: the subscription is dropped at once), and its bound on a send to a client that
stopped reading (``SEND_TIMEOUT_S``).
What this module adds is what to send and when to stop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from sglang_supervisor.redact import redact
from sglang_supervisor_api.auth import ApiAccess
from sglang_supervisor_api.responses import EventStreamResponse
from sglang_supervisor_api.routes import SupervisorDep

router = APIRouter()


#: A comment line on an idle event stream this often, so proxies and clients see it alive.
KEEP_ALIVE_S = 15.0
#: A client that takes no bytes for this long (it stopped reading; its TCP window is full)
#: is dropped: its stream held a connection and a subscription for as long as it lived.
SEND_TIMEOUT_S = 60.0
#: Between lines, on every event and the pings (sse-starlette's default is "\r\n", also on
#: each ServerSentEvent made here): the status page's reader splits events on "\n\n".
SEP = "\n"


async def _next_event(
    queue: asyncio.Queue[dict[str, Any]], stops: set[asyncio.Future[Any]]
) -> dict[str, Any] | None:
    """The next event; None when one of ``stops`` is done.

    The read is never left pending: a client that disconnects cancels this wait, and a
    ``queue.get()`` left behind would be destroyed pending ("Task was destroyed but it
    is pending!") once its queue is dropped."""
    get = asyncio.ensure_future(queue.get())
    try:
        await asyncio.wait({get, *stops}, return_when=asyncio.FIRST_COMPLETED)
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
) -> EventSourceResponse:
    """Server-sent events: state transitions, operation phases, release samples."""

    closing: asyncio.Event = request.app.state.closing
    access: ApiAccess = request.app.state.access
    # The token generation this stream was authorised under: a SIGHUP that rotates the
    # token ends it (the old token must not keep reading the daemon's events).
    generation = access.generation

    async def stream() -> AsyncIterator[ServerSentEvent]:
        yield ServerSentEvent(comment="sglang-supervisor events", sep=SEP)
        stop = asyncio.ensure_future(closing.wait())
        rotated = access.rotation()
        try:
            with sup.events.subscription(replay=replay) as queue:
                while not closing.is_set() and access.generation == generation:
                    event = await _next_event(queue, {stop, rotated})
                    if event is not None:
                        data = json.dumps(redact(event))
                        yield ServerSentEvent(data=data, event=event["kind"], sep=SEP)
        finally:
            stop.cancel()
            rotated.cancel()

    return EventSourceResponse(
        stream(),
        headers={"Cache-Control": "no-cache"},
        ping=KEEP_ALIVE_S,
        sep=SEP,
        send_timeout=SEND_TIMEOUT_S,
    )
