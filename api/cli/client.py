"""The one HTTP client of the daemon's control API: every CLI command talks through it.

Every failure becomes a ``ClientError`` (``sglang_supervisor_api.cli.client_errors``) whose
``str()`` is one line saying what happened and what the operator can do: the daemon unreachable
(``Unreachable``), a lever set refused (``Invalid``, 422), another operation running
(``Busy``, 409), a token refused (``Unauthorized``), anything else the daemon answered
(``HttpError``). No httpx exception leaves this module.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx

from sglang_supervisor_api.cli.client_errors import (
    Busy,
    ClientError,
    Ended,
    HttpError,
    Invalid,
    NotFound,
    Unauthorized,
    Unreachable,
)
from sglang_supervisor_api.cli.exits import UsageError
from sglang_supervisor_api.cli.tls import tls_failure, trust
from sglang_supervisor_api.env_names import TOKEN_ENV

DEFAULT_URL = "http://127.0.0.1:8470"
URL_ENV = "SGLANG_SUPERVISOR_URL"
#: How long a call with ``?wait=true`` may take: a restart loads a model (minutes).
OPERATION_WAIT_S = 3600.0

Json = dict[str, Any]


@dataclass(frozen=True)
class LogText:
    """The answer of ``GET /logs``: the lines and the file they came from (when said)."""

    lines: list[str]
    path: str | None


def normalize_url(url: str) -> str:
    """``host:port`` -> ``http://host:port``; no trailing slash."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


def resolve_token(token: str | None, token_file: Path | None) -> str | None:
    """``--token``, else the contents of ``--token-file`` (stripped, read as the daemon reads
    it), else ``$SGLANG_SUPERVISOR_TOKEN``.

    Raises ``ClientError`` when the token file cannot be read.
    """
    if token:
        return token.strip()
    if token_file is not None:
        try:
            text = token_file.read_text()
        except OSError as exc:
            raise ClientError(f"cannot read the token file {token_file}: {exc.strerror}") from exc
        return text.strip() or None
    return os.environ.get(TOKEN_ENV) or None


def _error_message(detail: Any, fallback: str) -> str:
    if isinstance(detail, dict) and detail.get("message"):
        return str(detail["message"])
    if isinstance(detail, str) and detail:
        return detail
    if isinstance(detail, list) and detail:
        return "; ".join(
            str(e.get("msg", e)) if isinstance(e, dict) else str(e) for e in detail[:5]
        )
    return fallback


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    # "[Errno 111] Connection refused" -> "connection refused"
    if text.startswith("[Errno") and "] " in text:
        text = text.split("] ", 1)[1]
    return text[:1].lower() + text[1:]


#: What an operation id may hold (the daemon's are 12 hex digits): an id is put in a URL
#: path, where ``../stop#`` would make ``cancel`` a POST /stop.
_OPERATION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def operation_path(op_id: str, tail: str = "") -> str:
    """``/operations/{op_id}{tail}``; raises ``UsageError`` for what is no operation id."""
    if not _OPERATION_ID.fullmatch(op_id):
        raise UsageError(
            f"{op_id!r} is not an operation id (letters, digits, - and _; the daemon's are "
            "12 hex digits): copy it from `sglang-supervisor operations`"
        )
    return f"/operations/{op_id}{tail}"


class Client:
    """The daemon's HTTP API, one method per call. Use as a context manager."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        cacert: Path | None = None,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
        url_from: str | None = None,
        url_hint: str = "pass --url",
    ) -> None:
        self.url = normalize_url(url)
        #: Where the URL came from (``--url``, the daemon's config...), said when it fails.
        self.url_from = url_from
        #: How to give another URL, for this command (``rollout`` has no ``--url``).
        self.url_hint = url_hint
        self._cacert = cacert
        self.timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._abandoned = False
        # Content-Type on every call: the daemon refuses a POST without it (a web page
        # cannot send it cross-site without a CORS preflight; docs/api.md).
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._token = token
        try:
            self.http = httpx.Client(
                base_url=self.url,
                headers=headers,
                timeout=self._timeout,
                trust_env=False,
                transport=transport,
                # https: the daemon's certificate checked against --cacert (or the system's)
                verify=trust(cacert) if self.url.startswith("https:") else True,
            )
        except (httpx.InvalidURL, ValueError) as exc:
            raise Unreachable(f"invalid daemon URL {url!r}: {exc}") from exc

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._abandoned:
            self.http.close()

    def renewed(self) -> Client:
        """A new client of the same daemon with the same token and timeouts (its own
        connections), for after a Ctrl-C that may have interrupted this one mid-call: this
        one is abandoned (its ``close`` does nothing: a lock it held could block it)."""
        self._abandoned = True
        return Client(
            self.url,
            token=self._token,
            cacert=self._cacert,
            timeout_s=self.timeout_s,
            connect_timeout_s=self._connect_timeout_s,
            url_from=self.url_from,
            url_hint=self.url_hint,
        )

    # ------------------------------------------------------------ plumbing

    def transport_error(self, exc: Exception) -> ClientError:
        """The ``ClientError`` for an httpx transport failure (never raises)."""
        if (tls := tls_failure(exc, self.url)) is not None:
            return Unreachable(tls)
        if isinstance(exc, httpx.RemoteProtocolError) and self.url.startswith("http:"):
            return Unreachable(
                f"the daemon at {self.url} closed the connection without answering "
                f"({_reason(exc)}); if it serves TLS ([api] ssl_certfile), use an https:// URL"
            )
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            whence = f"; the address is from {self.url_from}" if self.url_from else ""
            return Unreachable(
                f"cannot reach the daemon at {self.url} ({_reason(exc)}{whence}); is it "
                f"running? (start it with `sglang-supervisor serve`, or {self.url_hint})"
            )
        if isinstance(exc, httpx.TimeoutException):
            return ClientError(f"the daemon at {self.url} did not answer in time ({_reason(exc)})")
        if isinstance(exc, httpx.UnsupportedProtocol):
            return Unreachable(
                f"invalid daemon URL {self.url!r}: use http://HOST:PORT or https://HOST:PORT"
            )
        return Unreachable(f"talking to the daemon at {self.url} failed: {_reason(exc)}")

    def raise_for_status(self, r: httpx.Response) -> None:
        """Raise the ``HttpError`` subclass of an error answer (4xx/5xx); the one mapping of
        the daemon's answers to errors."""
        if r.status_code < 400:
            return
        try:
            body: Any = r.json()
        except ValueError:
            body = r.text
        detail = body.get("detail") if isinstance(body, dict) else body
        where = f"{r.request.method} {r.request.url.path}"
        message = _error_message(detail, f"{where} answered {r.status_code} {r.reason_phrase}")
        cls: type[HttpError] = HttpError
        if r.status_code == 422:
            cls = Invalid
        elif r.status_code == 409:
            cls = Busy
        elif r.status_code == 503 and "retry-after" in r.headers:
            cls = Busy  # the daemon is still starting (api/starting.py): try again shortly
        elif r.status_code in (401, 403):
            cls = Unauthorized
            hint = (
                "the daemon refused this call for this token"
                if self._token and r.status_code == 403  # the read-only token
                else "the daemon refused the token"
                if self._token
                else "the daemon wants a token: pass --token or --token-file, "
                "or set $SGLANG_SUPERVISOR_TOKEN"
            )
            message = f"{hint} ({r.status_code}: {message})"
        elif r.status_code == 404:
            cls = NotFound
            if detail == "Not Found":
                message = f"this daemon has no {r.request.url.path} (an older version?)"
        elif r.status_code >= 500:
            message = f"{where}: the daemon failed ({r.status_code}): {message}"
        raise cls(r.status_code, message, detail, body)

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int | float | bool] | None = None,
        json_body: Any = None,
        timeout_s: float | None = None,
    ) -> httpx.Response:
        timeout = self._timeout if timeout_s is None else httpx.Timeout(timeout_s, connect=5.0)
        try:
            r = self.http.request(method, path, params=params, json=json_body, timeout=timeout)
        except httpx.HTTPError as exc:
            raise self.transport_error(exc) from exc
        self.raise_for_status(r)
        return r

    def _json(self, method: str, path: str, **kw: Any) -> Json:
        r = self._request(method, path, **kw)
        try:
            data = r.json()
        except ValueError as exc:
            raise ClientError(f"{method} {path}: the daemon's answer is not JSON") from exc
        if not isinstance(data, dict):
            raise ClientError(f"{method} {path}: expected a JSON object, got {type(data).__name__}")
        return data

    # ------------------------------------------------------------ the API

    def status(self) -> Json:
        """``GET /status``: state, server, levers, GPUs, running operation, throughput."""
        return self._json("GET", "/status")

    def levers(self) -> Json:
        """``GET /levers``: ``levers``, ``env``, ``last_good``."""
        return self._json("GET", "/levers")

    def schema(self, word: str | None = None) -> Json:
        """``GET /levers/schema[?q=WORD]``: the installed SGLang's flags."""
        return self._json("GET", "/levers/schema", params={"q": word} if word else None)

    def operations(self, limit: int = 20) -> list[Json]:
        """``GET /operations?limit=N``: the recent operations, newest first."""
        ops = self._json("GET", "/operations", params={"limit": limit}).get("operations")
        return [op for op in ops if isinstance(op, dict)] if isinstance(ops, list) else []

    def operation(self, op_id: str) -> Json:
        """``GET /operations/{id}``: the operation (the answer's ``operation`` envelope,
        the one POST answers use; a daemon older than the envelope answered it bare)."""
        body = self._json("GET", operation_path(op_id))
        inner = body.get("operation")
        return inner if isinstance(inner, dict) else body

    def apply(
        self,
        levers: Mapping[str, Any],
        env: Mapping[str, Any],
        *,
        replace: bool = False,
        dry_run: bool = False,
        drain_timeout_s: float = 0.0,
        wait: bool = False,
        force_restart: bool = False,
        without_router: bool = False,
        effect_guard: bool | None = None,
    ) -> Json:
        """``POST /levers``; returns the operation (finished already for a dry run).

        Raises ``Invalid`` (422, nothing touched) or ``Busy`` (409).
        """
        body: dict[str, Any] = {
            "levers": dict(levers),
            "env": dict(env),
            "replace": replace,
            "dry_run": dry_run,
            "drain_timeout_s": drain_timeout_s,
        }
        # Sent only when asked for: a daemon from before these options refuses them.
        if force_restart:
            body["force_restart"] = True
        if without_router:
            body["without_router"] = True
        if effect_guard is not None:
            body["effect_guard"] = effect_guard
        return self.apply_body(body, wait=wait)

    def apply_body(self, body: Mapping[str, Any], *, wait: bool = False) -> Json:
        """``POST /levers`` with a whole request body (as ``POST /plan`` proposes one).

        Raises ``Invalid`` (422, nothing touched) or ``Busy`` (409).
        """
        data = self._json(
            "POST",
            "/levers",
            params={"wait": "true" if wait else "false"},
            json_body=dict(body),
            timeout_s=None if not wait else OPERATION_WAIT_S,
        )
        return dict(data["operation"])

    def reconcile(
        self, *, dry_run: bool = False, drain_timeout_s: float = 0.0, wait: bool = False
    ) -> Json:
        """``POST /reconcile``: the daemon re-reads its config and applies its levers;
        returns the operation. Raises ``Invalid`` (422) or ``Busy`` (409)."""
        data = self._json(
            "POST",
            "/reconcile",
            params={"wait": "true" if wait else "false"},
            json_body={"dry_run": dry_run, "drain_timeout_s": drain_timeout_s},
            timeout_s=None if not wait else OPERATION_WAIT_S,
        )
        return dict(data["operation"])

    def control(self, kind: str, *, wait: bool = False) -> Json:
        """``POST /stop``, ``/start`` or ``/restart``; returns the operation. Raises ``Busy``."""
        if kind not in ("stop", "start", "restart"):
            raise ValueError(kind)
        data = self._json(
            "POST",
            f"/{kind}",
            params={"wait": "true" if wait else "false"},
            timeout_s=None if not wait else OPERATION_WAIT_S,
        )
        return dict(data["operation"])

    def cancel(self, op_id: str, *, wait: bool = False) -> Json:
        """``POST /operations/{id}/cancel``: the operation ends at its next phase boundary
        and rolls back; returns it. Raises ``NotFound`` (unknown id) or ``Ended`` (409)."""
        try:
            data = self._json(
                "POST",
                operation_path(op_id, "/cancel"),
                params={"wait": "true" if wait else "false"},
                timeout_s=None if not wait else OPERATION_WAIT_S,
            )
        except Busy as exc:  # 409 here: it has already ended (detail.operation is it)
            raise Ended(exc.status, str(exc), exc.detail, exc.body) from None
        return dict(data["operation"])

    def logs(self, tail: int = 100, launch: int = 0) -> LogText:
        """``GET /logs?tail=N&launch=K``: the server's last lines (0 = the newest launch).

        Raises ``NotFound`` when this launch has no log, or the daemon has no ``/logs``
        (``endpoint_missing``).
        """
        r = self._request("GET", "/logs", params={"tail": tail, "launch": launch})
        text = r.text
        return LogText(text.splitlines(), r.headers.get("x-log-path"))

    def plan(self, body: Mapping[str, Any]) -> Json:
        """``POST /plan``: KV capacity now and with every helpful lever pulled.

        Raises ``Invalid`` (422) when the inputs cannot be planned for.
        """
        return self._json("POST", "/plan", json_body=dict(body), timeout_s=120.0)
