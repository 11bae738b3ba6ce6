"""Secrets passed as levers, kept out of everything the daemon shows.

SGLang's own secret flags (0.5.23: ``--api-key``, ``--admin-api-key``,
``--ssl-keyfile-password``) and environment variables whose name says they hold a secret
(``..._TOKEN``, ``..._SECRET``, ``..._PASSWORD``, ``..._API_KEY``...) are replaced by
:data:`REDACTED` in ``/status``, ``/levers``, operations, events, the audit log and the
status page. They still reach the server (argv / environment) and ``state.json`` (mode
0600 under the state directory), which it needs to relaunch.

Secrets inside any other string are hidden too, whatever the name it is under: the
password of a URL's userinfo (``HF_ENDPOINT=https://user:secret@host/``) and the value
of a secret-named query parameter (``?token=...``, ``&api_key=...``, ``&sig=...``) —
this module is the one place that decides what is secret.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar, cast

T = TypeVar("T")

REDACTED = "<redacted>"
#: SGLang 0.5.23's flags (dest names) whose value is a secret.
SECRET_LEVERS = frozenset({"api_key", "admin_api_key", "ssl_keyfile_password"})
_SECRET_WORDS = frozenset(
    {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "APIKEY", "AUTH"}
)
_KEY_QUALIFIERS = frozenset({"API", "ACCESS", "SECRET", "PRIVATE", "ADMIN", "AUTH"})
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


def redact_text(text: str) -> str:
    """``text`` with URL passwords and secret query values replaced by ``REDACTED``."""
    if "://" not in text and "=" not in text:
        return text
    text = _URL_USERINFO.sub(lambda m: f"{m['head']}{REDACTED}@", text)
    return _QUERY_PARAM.sub(
        lambda m: f"{m['head']}{REDACTED}" if is_secret_query(m["name"]) and m["value"] else m[0],
        text,
    )


def redact(value: T) -> T:
    """A copy of ``value`` (JSON-shaped) with every secret lever or env value replaced; a
    diff entry ``{"api_key": {"old": a, "new": b}}`` keeps its shape, both values hidden."""
    return cast(T, _redact(value))


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            if isinstance(k, str) and is_secret_name(k):
                out[k] = _hide(v)
            else:
                out[k] = _redact(v)
        return out
    if isinstance(value, list | tuple):
        return [_redact(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


def _hide(v: Any) -> Any:
    if v is None or isinstance(v, bool):
        return v  # "not set" / a flag carries no secret
    if isinstance(v, dict) and set(v) <= {"old", "new"}:
        return {k: _hide(x) for k, x in v.items()}
    return REDACTED
