"""The audit log: one JSON line per mutating call (who, what, the outcome, the lever diff).

Who: the socket's peer and which token it came with (``token``: ``admin``, ``read`` or
``none``).

The caller is the socket's peer address (uvicorn runs with ``proxy_headers`` off: an
``X-Forwarded-For`` header names nobody). Bounded, because anyone who reaches the port can
make refused calls: every value in a record is cut to ``MAX_VALUE_CHARS`` (a 1 MB lever
value is recorded as its start and its length) and a record to ``MAX_RECORD_CHARS``;
refused calls (no or a wrong token, invalid levers) are recorded at a bounded rate
(``REFUSED_BURST``, then one per ``REFUSED_EVERY_S``), the rest counted and summed up in
one ``suppressed`` record, so a flood cannot rotate the real records out of the file.
Accepted calls are always recorded.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from starlette.types import Scope

from sglang_supervisor.redact import redact

audit_log = logging.getLogger("supervisor.audit")

MAX_VALUE_CHARS = 256
MAX_ITEMS = 64
MAX_RECORD_CHARS = 8192
REFUSED_BURST = 20
REFUSED_EVERY_S = 10.0
#: Where the token guard (``sglang_supervisor_api.auth``) leaves which token a call came
#: with: "admin", "read" or "none" (no token needed, or none that matched).
TOKEN_SCOPE_KEY = "sglang_supervisor.token"


def client_address(scope: Scope) -> str:
    """The socket's peer (``host:port``): never a header the caller chose."""
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "unknown"


def bounded(value: Any, limit: int = MAX_VALUE_CHARS) -> Any:
    """``value`` with every string cut to ``limit`` characters and every list or mapping
    to ``MAX_ITEMS`` entries, each cut saying how much was left out."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        return f"{value[:limit]}... ({len(value)} characters)"
    if isinstance(value, dict):
        items = list(value.items())
        out = {str(k)[:limit]: bounded(v, limit) for k, v in items[:MAX_ITEMS]}
        if len(items) > MAX_ITEMS:
            out["..."] = f"{len(items) - MAX_ITEMS} more entries"
        return out
    if isinstance(value, (list, tuple)):
        kept = [bounded(v, limit) for v in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            kept.append(f"... {len(value) - MAX_ITEMS} more items")
        return kept
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return bounded(str(value), limit)


class _RefusedRate:
    """A token bucket for refused records; counts what it drops."""

    def __init__(self, burst: int, every_s: float, clock: Any = time.monotonic) -> None:
        self.burst, self.every_s, self.clock = burst, every_s, clock
        self.tokens = float(burst)
        self.at = clock()
        self.dropped = 0
        self.dropped_since: float | None = None
        self.dropped_clients: dict[str, int] = {}
        self._lock = threading.Lock()

    def allow(self, client: str) -> bool:
        with self._lock:
            now = self.clock()
            self.tokens = min(self.burst, self.tokens + (now - self.at) / self.every_s)
            self.at = now
            if self.tokens >= 1:
                self.tokens -= 1
                return True
            self.dropped += 1
            if self.dropped_since is None:
                self.dropped_since = time.time()
            host = client.rsplit(":", 1)[0]
            if host in self.dropped_clients or len(self.dropped_clients) < 10:
                self.dropped_clients[host] = self.dropped_clients.get(host, 0) + 1
            return False

    def take_summary(self) -> dict[str, Any] | None:
        """The ``suppressed`` record for what was dropped since the last one (or None)."""
        with self._lock:
            if not self.dropped:
                return None
            summary = {
                "time": time.time(),
                "action": "suppressed",
                "refused_not_recorded": self.dropped,
                "since": self.dropped_since,
                "clients": dict(self.dropped_clients),
            }
            self.dropped, self.dropped_since, self.dropped_clients = 0, None, {}
            return summary


_refused = _RefusedRate(REFUSED_BURST, REFUSED_EVERY_S)


def flush_suppressed() -> None:
    """Write the ``suppressed`` record now (the daemon stops: no later call will)."""
    summary = _refused.take_summary()
    if summary is not None:
        audit_log.warning("%s", json.dumps(summary, sort_keys=True))


def audit(scope: Scope, action: str, **fields: Any) -> None:
    """Record one call: who (the socket's address), what, and the outcome / lever diff.

    ``action == "refused"`` or ``outcome == "refused"`` is a refused call: recorded at a
    bounded rate (see the module docstring).
    """
    client = client_address(scope)
    refused = action == "refused" or fields.get("outcome") == "refused"
    if refused and not _refused.allow(client):
        return
    flush_suppressed()
    record = {
        "time": time.time(),
        "client": client,
        "method": scope.get("method"),
        "path": bounded(scope.get("path")),
        "action": action,
        "token": scope.get(TOKEN_SCOPE_KEY, "none"),
        # Whatever a caller passed: secret-named values and URL credentials never land here.
        **{k: bounded(redact(v)) for k, v in fields.items()},
    }
    text = json.dumps(record, sort_keys=True, default=str)
    if len(text) > MAX_RECORD_CHARS:
        # Still too big (many levers at once): keep who, what and the outcome.
        short = {k: v for k, v in record.items() if not isinstance(v, (dict, list))}
        short["truncated"] = f"{len(text)} characters; lever details left out"
        text = json.dumps(short, sort_keys=True, default=str)
    audit_log.info("%s", text)
