"""Bearer-token authentication and request size limits (the audit log:
``sglang_supervisor_api.audit``).

The token comes from ``$SGLANG_SUPERVISOR_TOKEN`` or ``[api] token_file`` (refused when the
file is readable by group or others). It is required on every call except :data:`PUBLIC_PATHS`
(health, readiness, the status page and API docs) and, when ``metrics_public``, ``/metrics``;
compared in constant time.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sglang_supervisor_api.audit import audit

TOKEN_ENV = "SGLANG_SUPERVISOR_TOKEN"
#: Served without the token: liveness and readiness probes, the status page and the API
#: docs (static: they ask for the token and send it on every call they make).
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/", "/ui", "/docs", "/openapi.json"})


class AuthConfigError(ValueError):
    """The token setup is unsafe or broken; the message says what to fix."""


def load_token(token_file: str | None) -> str | None:
    """The API token from the environment or ``token_file``; None when neither is set."""
    env = os.environ.get(TOKEN_ENV)
    if env is not None:
        if not env.strip():
            raise AuthConfigError(f"${TOKEN_ENV} is set but empty")
        return env.strip()
    if token_file is None:
        return None
    path = Path(token_file)
    try:
        st = path.stat()
    except OSError as exc:
        raise AuthConfigError(f"cannot read token file {path}: {exc.strerror}") from exc
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise AuthConfigError(
            f"token file {path} is readable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):o}); run: chmod 600 {path}"
        )
    token = path.read_text().strip()
    if not token:
        raise AuthConfigError(f"token file {path} is empty")
    return token


def is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_listen(host: str, token: str | None) -> None:
    """Refuse to serve a non-loopback address without a token."""
    if token is None and not is_loopback(host):
        raise AuthConfigError(
            f"refusing to listen on {host} without a token: anyone who reaches it could "
            f"reconfigure the GPU server. Set ${TOKEN_ENV} or [api] token_file, or listen "
            "on 127.0.0.1"
        )


async def _reply(send: Send, status: int, body: dict[str, Any], extra: list[Any]) -> None:
    data = json.dumps({"detail": body}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + extra})
    await send({"type": "http.response.body", "body": data})


@dataclass
class ApiAccess:
    """Who may call what; read on every request, so a reload (SIGHUP) applies at once."""

    #: The bearer token every call but /healthz needs; None: no token (loopback only).
    token: str | None
    #: /metrics without the token.
    metrics_public: bool = False
    #: Bumped by every token change (``rotate``): an /events stream remembers the
    #: generation it was authorised under and ends when it moves on.
    generation: int = 0
    _rotated: set[asyncio.Future[None]] = field(default_factory=set, repr=False)

    def rotate(self, token: str | None) -> None:
        """A new token (a SIGHUP reload): from now on only it opens the API, and every
        stream opened with the old one is closed (call it on the event loop)."""
        self.token = token
        self.generation += 1
        for waiter in list(self._rotated):
            if not waiter.done():
                waiter.set_result(None)

    def rotation(self) -> asyncio.Future[None]:
        """A future done at the next ``rotate`` (cancel it when no longer waited on)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._rotated.add(waiter)
        waiter.add_done_callback(self._rotated.discard)
        return waiter


class GuardMiddleware:
    """Token check and body-size limit, before any route runs."""

    def __init__(self, app: ASGIApp, *, access: ApiAccess, max_body_bytes: int) -> None:
        self.app = app
        self.access = access
        self.max_body = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        token = self.access.token
        public = path in PUBLIC_PATHS or (self.access.metrics_public and path == "/metrics")
        if token is not None and not public:
            headers = dict(scope.get("headers") or [])
            given = headers.get(b"authorization", b"").decode(errors="replace")
            scheme, _, credential = given.partition(" ")
            ok = scheme.lower() == "bearer" and hmac.compare_digest(
                credential.strip().encode(), token.encode()
            )
            if not ok:
                audit(scope, "refused", reason="missing or wrong bearer token")
                await _reply(
                    send,
                    401,
                    {"message": "a bearer token is required (Authorization: Bearer <token>)"},
                    [(b"www-authenticate", b'Bearer realm="sglang-supervisor"')],
                )
                return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            await _reply(send, 413, {"message": _too_large(self.max_body)}, [])
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise _TooLarge(self.max_body)
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await _reply(send, 413, {"message": _too_large(self.max_body)}, [])


class _TooLarge(HTTPException):
    """Raised from the body reader: FastAPI passes an HTTPException through (any other
    error there becomes its own 400), so a chunked body over the limit is a 413 too."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, detail={"message": _too_large(limit)})


def _too_large(limit: int) -> str:
    return (
        f"the request body is over {limit} bytes ([api] max_request_bytes); nothing was "
        "changed: send a smaller body or raise the limit"
    )
