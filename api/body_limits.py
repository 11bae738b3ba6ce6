"""What a request body may be: its size, how long it may take to arrive, and JSON that
says each key once. One middleware, inside the token check, before any route reads it.

- Larger than ``[api] max_request_bytes`` (by its ``Content-Length``, or as it streams
  in, chunked): **413**.
- Not all there within ``[api] body_timeout_s`` of the request's start: **408**, and the
  connection is closed. 400 connections each holding a 1 MiB body took the daemon to
  482 MB, never returned; with the connection cap (``[api] max_connections``, uvicorn's
  own ``limit_concurrency``: 503 beyond it) what the bodies can hold is bounded by
  ``max_connections × max_request_bytes`` for ``body_timeout_s`` at most.
- A JSON object that repeats a key (``{"dry_run": true, "dry_run": false}``): **422**
  naming the key. Python's parser keeps the last one silently, so a dry run became a
  real one; other parsers keep the first. Nothing is done.

The body is read as it is, nothing is buffered beyond what the route reads anyway (the
JSON check keeps one copy of a body within the size bound).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Methods whose body is never read (no JSON check, no deadline beyond their headers).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class _Refused(HTTPException):
    """Raised from the body reader: FastAPI passes an HTTPException through (any other
    error there becomes its own 400), and the app's handler gives it the error shape."""

    def __init__(self, status: int, message: str, problem: dict[str, Any] | None = None) -> None:
        detail: dict[str, Any] = {"message": message}
        if problem is not None:
            detail["problems"] = [problem]
        super().__init__(status, detail=detail, headers={"Connection": "close"})


class _Repeated(Exception):
    def __init__(self, key: str, keys: list[str]) -> None:
        super().__init__(key)
        self.key, self.keys = key, keys


def repeated_key(body: bytes) -> tuple[str, list[str]] | None:
    """(the first key an object of ``body`` repeats, that object's keys), or None (none
    repeats, or it is not JSON: the route's parser says what is wrong then)."""

    def once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Repeated(key, [k for k, _ in pairs])
            seen.add(key)
        return dict(pairs)

    try:
        json.loads(body, object_pairs_hook=once)
    except _Repeated as exc:
        return exc.key, exc.keys
    except (ValueError, RecursionError):
        return None
    return None


def too_large(limit: int) -> str:
    return (
        f"the request body is over {limit} bytes ([api] max_request_bytes); nothing was "
        "changed: send a smaller body or raise the limit"
    )


class BodyLimitsMiddleware:
    """The three rules of the module docstring, for every HTTP request."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, body_timeout_s: float) -> None:
        self.app = app
        self.max_body = max_body_bytes
        self.timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            await _reply(send, _Refused(413, too_large(self.max_body)))
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        check_json = scope["method"] not in SAFE_METHODS
        body = bytearray()
        seen = 0
        complete = False

        async def limited() -> Message:
            nonlocal seen, complete
            if complete:  # a disconnect listener (an event stream): no deadline
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise _Refused(
                    408,
                    f"the request body did not arrive within {self.timeout_s:g} s ([api] "
                    "body_timeout_s); nothing was changed: send it at once",
                ) from None
            if message["type"] != "http.request":
                complete = True
                return message
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_body:
                raise _Refused(413, too_large(self.max_body))
            if check_json:
                body.extend(chunk)
            if not message.get("more_body", False):
                complete = True
                found = repeated_key(bytes(body)) if check_json and body else None
                if found is not None:
                    key, keys = found
                    raise _Refused(
                        422,
                        "the request was refused; nothing was changed",
                        {
                            "lever": "body",
                            "message": f"the body's object with the keys {keys} gives the "
                            f"key {key!r} more than once: which one counts would be up to "
                            "the parser (a dry run became a real one); give it once. "
                            "Nothing was changed",
                            "type": "duplicate_key",
                        },
                    )
            return message

        try:
            await self.app(scope, limited, send)
        except _Refused as exc:  # raised where no route caught it (a body read by no route)
            await _reply(send, exc)


async def _reply(send: Send, exc: _Refused) -> None:
    data = json.dumps({"detail": exc.detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(data)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": exc.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": data})
