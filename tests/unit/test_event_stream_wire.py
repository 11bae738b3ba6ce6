"""``GET /events`` on the wire (sse-starlette, issue 27 §8), the app called as uvicorn calls
it (ASGI 2.3) over the fakes: keep-alive comments while idle, events as ``event:`` and
``data:``, a client that disconnects dropped at once, and a client that stopped reading
dropped after ``SEND_TIMEOUT_S`` (its stream held a connection and a subscription forever).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor_api import event_routes
from tests.inprocess import api_client

SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0", "spec_version": "2.3"},  # uvicorn's
    "http_version": "1.1",
    "method": "GET",
    "scheme": "http",
    "path": "/events",
    "raw_path": b"/events",
    "query_string": b"",
    "root_path": "",
    "headers": [(b"host", b"127.0.0.1:8470"), (b"accept", b"text/event-stream")],
    "client": ("127.0.0.1", 50124),
    "server": ("127.0.0.1", 8470),
}


def test_keep_alive_events_and_a_disconnect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(event_routes, "KEEP_ALIVE_S", 0.05)
    asyncio.run(_keep_alive_events_and_a_disconnect(tmp_path))


async def _keep_alive_events_and_a_disconnect(tmp_path: Path) -> None:
    async with api_client(tmp_path) as (_, rig, app):
        gone = asyncio.Event()
        body = bytearray()

        async def receive() -> dict[str, Any]:
            if not body:
                return {"type": "http.request", "body": b"", "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            body.extend(message.get("body", b""))

        served = asyncio.create_task(app(dict(SCOPE), receive, send))
        subscribers = rig.sup.events._subscribers
        for _ in range(200):
            if body.count(b": ping") >= 2 and subscribers:
                break
            await asyncio.sleep(0.01)
        assert body.count(b": ping") >= 2, bytes(body)  # kept alive while idle
        rig.sup.events.publish("state", state="ready")
        for _ in range(200):
            if b"event: state" in body:
                break
            await asyncio.sleep(0.01)
        assert b"\r" not in body  # the status page splits events on "\\n\\n"
        event = next(ln for ln in bytes(body).split(b"\n") if ln.startswith(b"data: "))
        assert json.loads(event[6:])["state"] == "ready"
        gone.set()  # the client goes
        await asyncio.wait_for(served, 5)
        assert not subscribers


def test_a_client_that_stopped_reading_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The send to it never completes (its window is full): the stream ends, the
    subscription goes. Before sse-starlette's send timeout it waited forever."""
    monkeypatch.setattr(event_routes, "SEND_TIMEOUT_S", 0.3, raising=False)
    asyncio.run(_a_client_that_stopped_reading_is_dropped(tmp_path))


async def _a_client_that_stopped_reading_is_dropped(tmp_path: Path) -> None:
    async with api_client(tmp_path) as (_, rig, app):
        started = asyncio.Event()
        forever = asyncio.Event()

        async def receive() -> dict[str, Any]:
            if not started.is_set():
                return {"type": "http.request", "body": b"", "more_body": False}
            await forever.wait()  # never disconnects either
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if started.is_set() and message.get("body"):
                await forever.wait()  # a client that stopped reading
            if message["type"] == "http.response.body":
                started.set()

        served = asyncio.create_task(app(dict(SCOPE), receive, send))
        await asyncio.wait_for(started.wait(), 5)
        rig.sup.events.publish("state", state="ready")  # a send that cannot complete
        done, _ = await asyncio.wait({served}, timeout=5)
        if not done:
            served.cancel()
        assert done, "the stream to a client that stopped reading never ended"
        assert not rig.sup.events._subscribers
