"""While the daemon's start-up still loads (the state, SGLang's flag schema, the GPUs),
the API already answers: reads show what is loading, and every call that could change
something answers 503 with ``Retry-After`` instead of queueing behind the start-up."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from sglang_supervisor.engine import Supervisor

#: Seconds a client is told to wait before trying again.
RETRY_AFTER_S = 1
_READS = frozenset({"GET", "HEAD", "OPTIONS"})


class StartingMiddleware:
    """503 + ``Retry-After`` for every non-read call while ``Supervisor.loading``."""

    def __init__(self, app: ASGIApp, supervisor: Supervisor) -> None:
        self.app = app
        self.supervisor = supervisor

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        loading = self.supervisor.loading
        if scope["type"] != "http" or loading is None or scope["method"] in _READS:
            await self.app(scope, receive, send)
            return
        detail = {
            "message": f"the daemon is still starting (loading {loading}); nothing was "
            f"changed: retry in {RETRY_AFTER_S} s (GET /status says what is loading)",
            "problems": [],
        }
        body = json.dumps({"detail": detail}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", str(RETRY_AFTER_S).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
