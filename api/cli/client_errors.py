"""What a ``Client`` call raises: ``ClientError`` (its ``str()`` one line saying what
happened and what to do) and its kinds: ``Unreachable``, ``StreamUnavailable``,
``HttpError`` and the statuses the CLI tells apart (``Invalid`` 422, ``Busy`` 409/503,
``Ended``, ``Unauthorized``, ``NotFound``).
"""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """Talking to the daemon failed; the message is one line for the operator."""


class Unreachable(ClientError):
    """No connection to the daemon (refused, timed out, bad address)."""


class StreamUnavailable(ClientError):
    """The daemon offers no event stream (an older daemon, or a proxy in between)."""


class HttpError(ClientError):
    """The daemon answered with an error status; ``detail`` is its JSON ``detail``."""

    def __init__(self, status: int, message: str, detail: Any = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail
        #: The whole decoded answer (for ``--json``), or the raw text.
        self.body = body


class Invalid(HttpError):
    """422: the request was refused and nothing was touched; ``problems`` names each lever."""

    @property
    def problems(self) -> list[tuple[str, str]]:
        """``(lever, message)`` for every problem the daemon named."""
        detail = self.detail
        if isinstance(detail, dict) and isinstance(detail.get("problems"), list):
            return [
                (str(p.get("lever", "?")), str(p.get("message", "")))
                for p in detail["problems"]
                if isinstance(p, dict)
            ]
        if isinstance(detail, list):  # FastAPI's own request validation errors
            out = []
            for err in detail:
                if isinstance(err, dict):
                    loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
                    out.append((loc or "request", str(err.get("msg", err))))
            return out
        return []


class Busy(HttpError):
    """409: another operation is running; ``operation_id`` names it. Also a 503 with
    Retry-After: the daemon is still starting (nothing was changed; try again)."""

    @property
    def operation_id(self) -> str | None:
        op = self.detail.get("operation") if isinstance(self.detail, dict) else None
        if isinstance(op, dict):  # an operation envelope
            op = op.get("id")
        return str(op) if op else None


class Ended(HttpError):
    """409 to a cancel: the operation has already ended, or is rolling back and cannot be
    cancelled (``still_running``); ``operation`` is its record."""

    @property
    def still_running(self) -> bool:
        """The refusal was not "already ended": a rollback runs and may not be cancelled."""
        return self.operation.get("state") == "running"

    @property
    def operation(self) -> dict[str, Any]:
        op = self.detail.get("operation") if isinstance(self.detail, dict) else None
        return op if isinstance(op, dict) else {}


class Unauthorized(HttpError):
    """401/403: no token, or the wrong one."""


class NotFound(HttpError):
    """404: either the endpoint does not exist on this daemon, or the thing asked for."""

    @property
    def endpoint_missing(self) -> bool:
        """True when the route itself is unknown (FastAPI's bare ``Not Found``)."""
        return bool(self.detail == "Not Found")
