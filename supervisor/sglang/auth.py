"""Which key SGLang 0.5.23 wants on which of its endpoints — the one rule for the daemon's
calls to its server and for the simulated server's check.

SGLang's ``decide_request_auth`` (``srt/utils/auth.py:74-150``) with the levels its
routes declare (``@auth_level`` in ``srt/entrypoints/http_server.py``):

- ``/health*``, ``/ready*``, ``/metrics*``: open, whatever keys the server has;
- ``ADMIN_OPTIONAL`` routes (the runtime endpoints: ``/set_internal_state``,
  ``/update_weights_from_disk``, the LoRA adapters, ``/hicache/storage-backend``...):
  ``admin_api_key`` when the server has one (its
  ``api_key`` is then *not* accepted), else ``api_key``, else open;
- every other route (``/server_info``, ``/model_info``, ``/generate``...):
  ``api_key`` when the server has one (even beside an ``admin_api_key``), else open.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

OPEN_PREFIXES = ("/health", "/ready", "/metrics")
#: Routes declared ``@auth_level(AuthLevel.ADMIN_OPTIONAL)`` (0.5.23; every method of each).
ADMIN_OPTIONAL_PATHS = frozenset(
    {
        "/abort_request",
        "/configure_logging",
        "/continue_generation",
        "/flush_cache",
        "/freeze_gc",
        "/hicache/storage-backend",
        "/load_lora_adapter",
        "/pause_generation",
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/set_internal_state",
        "/slow_down",
        "/start_profile",
        "/stop_profile",
        "/unload_lora_adapter",
        "/update_weight_version",
        "/update_weights_from_disk",
        "/update_weights_from_distributed",
        "/update_weights_from_tensor",
    }
)


@dataclass(frozen=True)
class ServerKeys:
    """The keys a server was launched with (its ``api_key`` and ``admin_api_key`` levers)."""

    # Never in a repr (a log line or an exception that shows the object): they are secrets.
    api_key: str | None = field(default=None, repr=False)
    admin_api_key: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, levers: Mapping[str, Any]) -> ServerKeys:
        api, admin = levers.get("api_key"), levers.get("admin_api_key")
        return cls(str(api) if api else None, str(admin) if admin else None)


def expected_key(keys: ServerKeys, method: str, path: str) -> str | None:
    """The bearer token ``method path`` needs on a server with ``keys`` (None: none). In
    0.5.23 a route's level is the same for each of its methods."""
    if path.startswith(OPEN_PREFIXES):
        return None
    if path in ADMIN_OPTIONAL_PATHS:
        return keys.admin_api_key or keys.api_key
    return keys.api_key


def headers(keys: ServerKeys, method: str, path: str) -> dict[str, str]:
    """The ``Authorization`` header for a call of ours (empty when none is needed)."""
    key = expected_key(keys, method, path)
    return {"Authorization": f"Bearer {key}"} if key else {}


def allowed(keys: ServerKeys, method: str, path: str, authorization: str | None) -> bool:
    """SGLang's verdict on a request with this ``Authorization`` header."""
    key = expected_key(keys, method, path)
    if key is None:
        return True
    scheme, _, token = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token, key)
