"""Secrets, kept out of everything the daemon shows: the one rule for every path out.

What is secret: SGLang's own secret flags (0.5.23: ``--api-key``, ``--admin-api-key``,
``--ssl-keyfile-password``), environment variables whose name says they hold a secret
(``..._TOKEN``, ``..._SECRET``, ``..._PASSWORD``, ``..._API_KEY``...), the password of a
URL's userinfo (``HF_ENDPOINT=https://user:secret@host/``) and the value of a
secret-named query parameter (``?token=...``, ``&api_key=...``, ``&sig=...``).

Where it is hidden: every answer (``/status``, ``/levers``, operations and their
``log_tail``, events, ``/logs``, ``/plan``), the audit log, the daemon's own log and the
server's lines it forwards there (``log_to_journal``) — each goes through :func:`redact`
or :func:`redact_text`, and nothing else decides. In JSON-shaped values a secret-named
key hides its value; in text, a secret name hides the value printed after it in each form
SGLang and Python print one: ``api_key='k1'`` (``ServerArgs.__repr__``,
``srt/server_args.py:307``), ``'api_key': 'k1'`` (the ``server_args=`` line SGLang 0.5.23
logs at start, a dict: ``srt/entrypoints/engine.py:173`` and ``:311``), ``"api_key":
"k1"`` (JSON), ``--api-key k1`` / ``--api-key=k1`` / ``'--api-key', 'k1'`` (a command
line), ``HF_TOKEN=hf_x`` (an environment) — whatever the value's length. And the values
themselves, wherever they appear (a traceback quoting one): those of the secret levers
and environment variables of every server this daemon launched or adopted (the last
``MAX_KNOWN``, :func:`remember`), and of its own environment's secret-named variables
(``HF_TOKEN`` from the unit's environment file) — unless shorter than
``MIN_SECRET_CHARS`` (that would hide every "1" or "on"; their printed forms above are
still hidden).

The server still gets them (its ``--config`` file, its environment: never its argv,
``engine/server.py``), and so does ``state.json`` (mode 0600 under the state directory),
which the daemon needs to relaunch.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar, cast

T = TypeVar("T")

REDACTED = "<redacted>"
#: SGLang 0.5.23's flags (dest names) whose value is a secret.
SECRET_LEVERS = frozenset({"api_key", "admin_api_key", "ssl_keyfile_password"})
_SECRET_WORDS = frozenset(
    {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "APIKEY", "AUTH"}
)
_KEY_QUALIFIERS = frozenset({"API", "ACCESS", "SECRET", "PRIVATE", "ADMIN", "AUTH"})
#: A literal secret shorter than this is not searched for in text (it would hide "1").
MIN_SECRET_CHARS = 6
#: The literal values remembered from launches (the newest kept): bounded over weeks.
MAX_KNOWN = 64
#: ``scheme://user:password@``: the password (up to the last ``@`` before the host). The
#: scheme's length is bounded: unbounded, a long run of letters before an ``=`` made every
#: match attempt rescan it (quadratic: 40,000 characters took 1.7 s, holding the GIL).
_URL_USERINFO = re.compile(
    r"(?P<head>[A-Za-z][A-Za-z0-9+.-]{0,63}://[^\s:/?#@]*:)(?P<pw>[^\s/?#]*)@"
)
#: ``?name=value`` / ``&name=value`` / ``;name=value`` in a URL's query.
_QUERY_PARAM = re.compile(r"(?P<head>[?&;](?P<name>[A-Za-z0-9_.-]+)=)(?P<value>[^&#\s]*)")
#: Query parameter names that carry a secret although no secret word is in them
#: (signed URLs: S3's X-Amz-Signature, Azure's sig, GCS's X-Goog-Signature).
_SECRET_QUERY = frozenset({"KEY", "SIG", "SIGNATURE", "X_AMZ_SIGNATURE", "X_GOOG_SIGNATURE"})
#: A Python or JSON string literal, escapes included (``'a"b\'c'``), on one line; bounded
#: (``a='a='a='...`` would rescan the rest of the line from every quote).
_QUOTED = r"'(?:[^'\\\n]|\\.){0,1024}'|\"(?:[^\"\\\n]|\\.){0,1024}\""
#: ``name='v'``, ``'name': 'v'``, ``"name": "v"``, ``name: 'v'``: a name (bounded, so no
#: run of letters is rescanned from every position) and the quoted value printed after it.
_NAMED_VALUE = re.compile(
    rf"(?<![\w.-])(?P<head>(?P<q>['\"]?)(?P<name>[A-Za-z_][\w.-]{{0,127}})(?P=q)"
    rf"\s*(?:=|:[ \t]*))(?P<value>{_QUOTED})"
)
#: ``HF_TOKEN=hf_x``, ``api_key=k1`` unquoted (an environment, a shell line).
_BARE_VALUE = re.compile(
    r"(?<![\w.-])(?P<head>(?P<name>[A-Za-z_][A-Za-z0-9_]{0,127})=)(?P<value>[^\s'\"&;,)\]}]+)"
)
_OPTIONS = sorted(
    {f"--{d}" for d in SECRET_LEVERS} | {"--" + d.replace("_", "-") for d in SECRET_LEVERS},
    key=len,
    reverse=True,
)
#: ``--api-key k1``, ``--api-key=k1``, ``'--api-key', 'k1'`` (a list's repr), ``--api-key "k1"``.
_OPTION_VALUE = re.compile(
    rf"(?P<head>(?:{'|'.join(map(re.escape, _OPTIONS))})(?:=|['\"]?,?[ \t]+))"
    rf"(?P<value>{_QUOTED}|[^\s'\",\])]+)"
)
_OPTION_NAMES = frozenset(_OPTIONS)


def is_secret_env(name: str) -> bool:
    """``HF_TOKEN``, ``SGLANG_API_KEY``, ``NCCL_..._SECRET``; not ``SGLANG_MAX_TOKENS``."""
    if not name.isupper():
        return False
    parts = name.split("_")
    if any(p in _SECRET_WORDS for p in parts):
        return True
    return any(
        p == "KEY" and i > 0 and parts[i - 1] in _KEY_QUALIFIERS for i, p in enumerate(parts)
    )


def is_secret_name(name: str) -> bool:
    """A lever dest name, an env var name, or a diff key (``env.NAME``) holding a secret."""
    if name in SECRET_LEVERS:
        return True
    return is_secret_env(name.removeprefix("env."))


def is_secret_query(name: str) -> bool:
    """``token``, ``access_token``, ``api_key``, ``sig``; not ``revision`` or ``max_tokens``."""
    upper = name.upper().replace("-", "_").replace(".", "_")
    return upper in _SECRET_QUERY or is_secret_env(upper)


def secret_values(levers: Mapping[str, Any], env: Mapping[str, Any]) -> tuple[str, ...]:
    """The values of the secret levers and environment variables of one lever set."""
    found = {str(v) for k, v in levers.items() if is_secret_name(k) and v not in (None, "")}
    found |= {str(v) for k, v in env.items() if is_secret_env(k) and v}
    return tuple(sorted(found))


class _Known:
    """The literal secrets hidden in every text: the daemon's environment's (read once)
    and the last ``MAX_KNOWN`` remembered from launches. Written on the event loop, read
    from any thread (the log forwarder's): readers take the current tuple."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._remembered: dict[str, None] = {}
        self._environ: tuple[str, ...] | None = None
        self.values: tuple[str, ...] = ()

    def add(self, values: Iterable[str]) -> None:
        with self._lock:
            for v in values:
                if len(v) >= MIN_SECRET_CHARS:
                    self._remembered.pop(v, None)
                    self._remembered[v] = None  # the newest last
            while len(self._remembered) > MAX_KNOWN:
                del self._remembered[next(iter(self._remembered))]
            self._publish()

    def get(self) -> tuple[str, ...]:
        if self._environ is None:
            with self._lock:
                if self._environ is None:
                    self._environ = tuple(
                        v
                        for k, v in os.environ.items()
                        if is_secret_env(k) and len(v) >= MIN_SECRET_CHARS
                    )
                    self._publish()
        return self.values

    def _publish(self) -> None:
        # Longest first: a secret that contains another is hidden whole.
        merged = set(self._remembered) | set(self._environ or ())
        self.values = tuple(sorted(merged, key=len, reverse=True))


_known = _Known()


def remember(levers: Mapping[str, Any], env: Mapping[str, Any]) -> None:
    """From now on hide the secret values of this lever set in every text (a launch or an
    adoption: its log prints them). Bounded: the newest ``MAX_KNOWN`` are kept."""
    _known.add(secret_values(levers, env))


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret in it replaced by ``REDACTED`` (the module docstring
    lists the forms); ``secrets``: literal values to hide besides the known ones."""
    if "=" in text or ":" in text or "--" in text:
        text = _NAMED_VALUE.sub(_hide_named, text)
        if "--" in text:
            text = _OPTION_VALUE.sub(_hide_option, text)
        if "=" in text:
            text = _BARE_VALUE.sub(_hide_bare, text)
    for secret in (*sorted(secrets, key=len, reverse=True), *_known.get()):
        if len(secret) >= MIN_SECRET_CHARS and secret in text:
            text = text.replace(secret, REDACTED)
    if "://" not in text and "=" not in text:
        return text
    text = _URL_USERINFO.sub(lambda m: f"{m['head']}{REDACTED}@", text)
    return _QUERY_PARAM.sub(
        lambda m: f"{m['head']}{REDACTED}" if is_secret_query(m["name"]) and m["value"] else m[0],
        text,
    )


def _quoted(value: str) -> str:
    """``REDACTED`` in the quotes ``value`` had (none when it had none)."""
    q = value[0] if value[:1] in ("'", '"') else ""
    return f"{q}{REDACTED}{q}"


def _hide_named(m: re.Match[str]) -> str:
    if not is_secret_name(m["name"]) or m["value"] in ("''", '""'):
        return m[0]
    return f"{m['head']}{_quoted(m['value'])}"


def _hide_bare(m: re.Match[str]) -> str:
    if not is_secret_name(m["name"]) or m["value"] in ("None", "null"):
        return m[0]
    return f"{m['head']}{REDACTED}"


def _hide_option(m: re.Match[str]) -> str:
    return f"{m['head']}{_quoted(m['value'])}"


def redact(value: T, secrets: Iterable[str] = ()) -> T:
    """A copy of ``value`` (JSON-shaped) with every secret lever or env value replaced; a
    diff entry ``{"api_key": {"old": a, "new": b}}`` keeps its shape, both values hidden;
    every string in it through :func:`redact_text`."""
    return cast(T, _redact(value, tuple(secrets)))


def _redact(value: Any, secrets: tuple[str, ...]) -> Any:
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if isinstance(k, str) and is_secret_name(k):
                out[k] = _hide(v)
            else:
                out[k] = _redact(v, secrets)
        return out
    if isinstance(value, list | tuple):
        items = [_redact(v, secrets) for v in value]
        # An argv as a list: the element after a secret option is its value.
        for i, v in enumerate(value[:-1]):
            if isinstance(v, str) and v in _OPTION_NAMES and isinstance(items[i + 1], str):
                items[i + 1] = REDACTED
        return items
    if isinstance(value, str):
        return redact_text(value, secrets)
    return value


def _hide(v: Any) -> Any:
    if v is None or isinstance(v, bool):
        return v  # "not set" / a flag carries no secret
    if isinstance(v, dict) and set(v) <= {"old", "new"}:
        return {k: _hide(x) for k, x in v.items()}
    return REDACTED
