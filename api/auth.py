"""Bearer-token authentication (the audit log: ``sglang_supervisor_api.audit``; a request
body's limits: ``sglang_supervisor_api.body_limits``).

The token comes from ``$SGLANG_SUPERVISOR_TOKEN`` or ``[api] token_file`` (refused when the
file is readable by group or others). It is required on every call except :data:`PUBLIC_PATHS`
(health, readiness, the status page and API docs) and, when ``metrics_public``, ``/metrics``;
compared in constant time.

A second, read-only token (``$SGLANG_SUPERVISOR_READ_TOKEN`` or ``[api] read_token_file``,
read by the same rules) opens every ``GET`` and ``POST /plan`` (it computes, changes
nothing) and gets 403 on every other call: :func:`read_only_allows` is the one rule, by
method, so a state-changing route added later is closed to it without a list to update.
Which token a call came with (``admin``, ``read`` or ``none``) is in the request's scope
(:data:`TOKEN_SCOPE_KEY`), and the audit log records it.
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

from starlette.types import ASGIApp, Receive, Scope, Send

from sglang_supervisor.config import ApiSettings
from sglang_supervisor.files import FileRefused, read_regular
from sglang_supervisor_api.audit import TOKEN_SCOPE_KEY, audit
from sglang_supervisor_api.env_names import READ_TOKEN_ENV, TOKEN_ENV

#: Methods that change nothing: the read-only token may use them on every route.
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: POST routes that change nothing (``/plan`` computes a proposal, applies nothing).
READ_ONLY_POSTS = frozenset({"/plan"})
#: Served without the token: liveness and readiness probes, the status page and the API
#: docs (static: they ask for the token and send it on every call they make).
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/", "/ui", "/docs", "/openapi.json"})


class AuthConfigError(ValueError):
    """The token setup is unsafe or broken; the message says what to fix."""


def load_token(token_file: str | None) -> str | None:
    """The API token from the environment or ``token_file``; None when neither is set."""
    return _load_secret(TOKEN_ENV, token_file, "token file")


def load_read_token(read_token_file: str | None) -> str | None:
    """The read-only token from ``$SGLANG_SUPERVISOR_READ_TOKEN`` or ``read_token_file``
    (the same rules as the main token's); None when neither is set."""
    return _load_secret(READ_TOKEN_ENV, read_token_file, "read token file")


def _load_secret(env_name: str, token_file: str | None, what: str) -> str | None:
    env = os.environ.get(env_name)
    if env is not None:
        if not env.strip():
            raise AuthConfigError(f"${env_name} is set but empty")
        return env.strip()
    if token_file is None:
        return None
    path = Path(token_file)
    try:
        # Regular, bounded, with a deadline: a FIFO or a hung mount never blocks (files.py).
        read = read_regular(path, what, max_bytes=64 << 10)
        token = read.text().strip()
    except OSError as exc:
        raise AuthConfigError(f"cannot read {what} {path}: {exc.strerror}") from exc
    except (FileRefused, UnicodeDecodeError) as exc:
        raise AuthConfigError(
            str(exc) if isinstance(exc, FileRefused) else f"{what} {path} is not UTF-8 text"
        ) from exc
    if read.st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise AuthConfigError(
            f"{what} {path} is readable by group or others (mode "
            f"{stat.S_IMODE(read.st.st_mode):o}); run: chmod 600 {path}"
        )
    if not token:
        raise AuthConfigError(f"{what} {path} is empty")
    return token


def check_read_token(token: str | None, read_token: str | None) -> None:
    """Refuse a read-only token that would promise nothing: without the main token every
    call is open anyway, and one equal to it could not tell the two apart."""
    if read_token is None:
        return
    if token is None:
        raise AuthConfigError(
            f"a read-only token is set (${READ_TOKEN_ENV} or [api] read_token_file) but no "
            f"token: without ${TOKEN_ENV} or [api] token_file every call is open, so the "
            "read-only one limits nothing. Set the token too, or remove the read-only one"
        )
    if hmac.compare_digest(token.encode(), read_token.encode()):
        raise AuthConfigError(
            "the read-only token is the same as the token: give it its own value "
            "(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )


def read_only_allows(method: str, path: str) -> bool:
    """Whether the read-only token may make this call: any ``GET``/``HEAD``/``OPTIONS``, and the
    POSTs that change nothing (:data:`READ_ONLY_POSTS`)."""
    return method in READ_METHODS or (method == "POST" and path in READ_ONLY_POSTS)


def load_tokens(api: ApiSettings, host: str) -> tuple[str | None, str | None]:
    """The token and the read-only token of ``api``, checked for serving on ``host``
    (``check_listen``, ``check_read_token``). Raises ``AuthConfigError``."""
    token = load_token(api.token_file)
    read_token = load_read_token(api.read_token_file)
    check_listen(host, token)
    check_read_token(token, read_token)
    return token, read_token


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
    #: The read-only token (``read_only_allows``); None: none.
    read_token: str | None = None
    #: /metrics without the token.
    metrics_public: bool = False
    #: Bumped by every token change (``rotate``): an /events stream remembers the
    #: generation it was authorised under and ends when it moves on.
    generation: int = 0
    _rotated: set[asyncio.Future[None]] = field(default_factory=set, repr=False)

    def rotate(self, token: str | None, read_token: str | None = None) -> None:
        """New tokens (a SIGHUP reload): from now on only they open the API, and every
        open stream is closed (call it on the event loop)."""
        self.token = token
        self.read_token = read_token
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
    """The token check, before any route runs (the body's limits are
    ``sglang_supervisor_api.body_limits``', inside this one)."""

    def __init__(self, app: ASGIApp, *, access: ApiAccess) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        token = self.access.token
        public = path in PUBLIC_PATHS or (self.access.metrics_public and path == "/metrics")
        scope[TOKEN_SCOPE_KEY] = "none"
        if token is not None and not public:
            role = self._role(scope, token)
            scope[TOKEN_SCOPE_KEY] = role or "none"
            if role is None:
                audit(scope, "refused", reason="missing or wrong bearer token")
                await _reply(
                    send,
                    401,
                    {"message": "a bearer token is required (Authorization: Bearer <token>)"},
                    [(b"www-authenticate", b'Bearer realm="sglang-supervisor"')],
                )
                return
            method: str = scope["method"]
            if role == "read" and not read_only_allows(method, path):
                audit(scope, "refused", reason="the read-only token on a call that changes state")
                await _reply(send, 403, {"message": _read_only(method, path)}, [])
                return
        await self.app(scope, receive, send)

    def _role(self, scope: Scope, token: str) -> str | None:
        """ "admin", "read" or None (no or a wrong bearer token); both compared in
        constant time, both always (the time says nothing about which one matched)."""
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"").decode(errors="replace")
        scheme, _, credential = given.partition(" ")
        offered = credential.strip().encode()
        read_token = self.access.read_token
        admin = hmac.compare_digest(offered, token.encode())
        read = read_token is not None and hmac.compare_digest(offered, read_token.encode())
        if scheme.lower() != "bearer":
            return None
        return "admin" if admin else "read" if read else None


def _read_only(method: str, path: str) -> str:
    return (
        f"this token can only read; {method} {path} changes the server or its levers and "
        "needs the token ([api] token_file / $SGLANG_SUPERVISOR_TOKEN), not the read-only "
        "one ([api] read_token_file / $SGLANG_SUPERVISOR_READ_TOKEN); nothing was changed"
    )
