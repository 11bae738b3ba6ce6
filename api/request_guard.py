"""What a web page could forge, and what a request may not say (issue 19 §2, §7).

A daemon on loopback without a token is reachable from every page the operator's browser
opens. Three checks keep such pages out, before the token check and any route:

* **Host** names this daemon (:class:`HostPolicy`): a loopback name or address, the bound
  address, this host's names (and, bound to a wildcard, its addresses), or an
  ``[api] allowed_hosts`` entry. A loopback or bound name with a port must carry the port
  the daemon listens on. Else 421: a DNS-rebound page (``evil.example`` resolving to
  127.0.0.1) gets nothing, not even a read.
* **Origin**, when a browser sends one on a state-changing request, must be this daemon's
  own (``scheme://<the Host header>``): else 403. The status page is same-origin.
* **Content-Type** of every POST is ``application/json``: else 415. A page can send a
  "simple" cross-origin request only as ``text/plain``, a form or multipart; with
  ``application/json`` the browser must ask first (a CORS preflight, which we never grant).

And every route refuses a query parameter it does not declare (422, :func:`known_query`):
``?dry_run=true`` on a route that did not read it would be silently ignored.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import psutil
from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from sglang_supervisor_api.audit import audit

#: Methods that change nothing (no Origin or Content-Type check).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: What curl, the CLI and the status page send on every POST.
JSON_TYPE = "application/json"
WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def _split_host(value: str) -> tuple[str, int | None] | None:
    """``name`` / ``name:port`` / ``[v6]:port`` -> (lowercase name, port); None if malformed."""
    try:
        parts = urlsplit("//" + value.strip())
        port = parts.port
    except ValueError:
        return None
    name = (parts.hostname or "").lower().rstrip(".")
    if not name or parts.username is not None or parts.password is not None or parts.path:
        return None
    return name, port


def _is_loopback(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_names(bind_host: str) -> set[str]:
    """This host's names, and (bound to a wildcard) every address of its interfaces."""
    names = {bind_host.lower().strip("[]")}
    hostname = socket.gethostname().lower()  # no getfqdn(): a DNS lookup at start-up
    names |= {hostname, hostname.split(".")[0]}
    if bind_host.strip("[]") in WILDCARDS:
        for addrs in psutil.net_if_addrs().values():
            for addr in addrs:
                if addr.family in (socket.AF_INET, socket.AF_INET6):
                    names.add(addr.address.split("%")[0].lower())
    return names


class HostPolicy:
    """Which ``Host`` headers name this daemon (see the module docstring)."""

    def __init__(self, bind_host: str, allowed_hosts: Iterable[str] = ()) -> None:
        self.any = False
        self.names = _host_names(bind_host)
        #: Configured entries: name -> the port it must carry (None: any port).
        self.configured: dict[str, set[int | None]] = {}
        for entry in allowed_hosts:
            if entry.strip() == "*":
                self.any = True
                continue
            split = _split_host(entry)
            if split is not None:
                self.configured.setdefault(split[0], set()).add(split[1])

    def allows(self, host: str, listen_port: int | None) -> bool:
        if self.any:
            return True
        split = _split_host(host)
        if split is None:
            return False
        name, port = split
        ports = self.configured.get(name)
        if ports is not None and (None in ports or port in ports):
            return True
        if _is_loopback(name) or name in self.names:
            return port is None or listen_port is None or port == listen_port
        return False


async def _reply(send: Send, status: int, message: str) -> None:
    data = json.dumps({"detail": {"message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class BrowserGuardMiddleware:
    """The Host, Origin and Content-Type checks, before the token check and any route."""

    def __init__(self, app: ASGIApp, *, hosts: HostPolicy) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is not None:
            status, message = refusal
            audit(scope, "refused", reason=message)
            await _reply(send, status, message)
            return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        """(status, message) when the request is refused, else None."""
        headers: dict[bytes, bytes] = {}
        for key, value in scope.get("headers") or []:
            headers.setdefault(key.lower(), value)
        host = headers.get(b"host", b"").decode("latin-1")
        server = scope.get("server")
        # A Unix socket (no port) cannot be reached by a page through DNS: no Host check.
        listen_port = server[1] if server and len(server) > 1 else None
        if listen_port is not None and not self.hosts.allows(host, listen_port):
            return (
                421,
                f"Host {host!r} does not name this daemon (a page on another site may have "
                "pointed its own name at this address: DNS rebinding). Use 127.0.0.1, "
                "localhost or the address it listens on, or add the name to [api] "
                "allowed_hosts",
            )
        if scope["method"] in SAFE_METHODS:
            return None
        origin = headers.get(b"origin")
        if origin is not None:
            text = origin.decode("latin-1")
            parts = urlsplit(text)
            if parts.scheme not in ("http", "https") or parts.netloc.lower() != host.lower():
                return (
                    403,
                    f"{scope['method']} {scope['path']} from the web page at origin {text!r} "
                    "refused: only this daemon's own pages may change anything (a page on "
                    "another site cannot drive it); use the CLI, curl or the status page",
                )
        ctype = headers.get(b"content-type", b"").decode("latin-1")
        if ctype.split(";")[0].strip().lower() != JSON_TYPE:
            shown = repr(ctype) if ctype else "none"
            return (
                415,
                f"{scope['method']} {scope['path']} needs Content-Type: {JSON_TYPE} (got "
                f"{shown}), also without a body, so that no web page can send it without "
                "the browser asking first; curl: -H 'Content-Type: application/json'",
            )
        return None


_DECLARED: dict[int, frozenset[str]] = {}


def _query_names(dependant: Dependant) -> set[str]:
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


def _declared(route: APIRoute) -> frozenset[str]:
    known = _DECLARED.get(id(route))
    if known is None:
        known = _DECLARED[id(route)] = frozenset(_query_names(route.dependant))
    return known


async def known_query(request: Request) -> None:
    """Refuse (422) a query parameter the route does not declare: a client that thinks it
    asked for something (``?dry_run=true``) must not get something else done."""
    route: Any = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    known = _declared(route)
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        takes = ", ".join(sorted(known)) or "none"
        raise RequestValidationError(
            [
                {
                    "loc": ("query", name),
                    "msg": f"unknown query parameter {name!r} on {request.method} "
                    f"{route.path} (it takes: {takes}); nothing was done",
                    "type": "extra_forbidden",
                }
                for name in unknown
            ]
        )
