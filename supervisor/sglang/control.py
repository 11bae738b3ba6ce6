"""A client of SGLang's runtime endpoints: what changes a running server without a restart,
and the read-backs that confirm it (SGLang 0.5.23, ``srt/entrypoints/http_server.py``).

Every call answers an ``Answer``: whether SGLang said yes, its status and its own words.
A server that cannot be reached raises ``ControlError``. These endpoints are SGLang's
``ADMIN_OPTIONAL`` ones, the read-backs (``/server_info``) normal ones: which of the server's
keys each takes is ``sglang_supervisor.sglang.auth``'s rule (SGLang's ``decide_request_auth``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from sglang_supervisor.sglang import auth
from sglang_supervisor.sglang.auth import ServerKeys


class ControlError(RuntimeError):
    """The server could not be asked (refused, timed out): what was asked and why."""


@dataclass(frozen=True)
class Answer:
    ok: bool
    status: int
    #: SGLang's words (its message, its error text), for the operation's detail.
    detail: str
    body: Any = None


class ServerControl:
    """SGLang's runtime endpoints over one pooled ``httpx.AsyncClient`` (no proxies)."""

    def __init__(self) -> None:
        self._client = httpx.AsyncClient(trust_env=False)

    async def _call(
        self,
        method: str,
        url: str,
        path: str,
        *,
        keys: ServerKeys,
        timeout_s: float,
        body: Mapping[str, Any] | None = None,
    ) -> tuple[int, Any, str]:
        headers = auth.headers(keys, method, path)
        try:
            r = await self._client.request(
                method, f"{url}{path}", json=body, headers=headers, timeout=timeout_s
            )
        except httpx.TimeoutException as exc:
            raise ControlError(f"{method} {url}{path} timed out after {timeout_s:g}s") from exc
        except httpx.HTTPError as exc:
            raise ControlError(f"{method} {url}{path} failed: {type(exc).__name__}: {exc}") from exc
        text = r.text.strip()
        try:
            data = r.json() if text else None
        except ValueError:
            data = None
        return r.status_code, data, text

    async def set_internal_state(
        self, url: str, values: Mapping[str, Any], *, keys: ServerKeys, timeout_s: float
    ) -> Answer:
        """``POST /set_internal_state``: ok when every DP worker answered ``updated``
        (SGLang checks every key before it changes any; its reason is in its log)."""
        path = "/set_internal_state"
        status, data, text = await self._call(
            "POST", url, path, keys=keys, timeout_s=timeout_s, body={"server_args": dict(values)}
        )
        ok = status == 200 and isinstance(data, list) and bool(data) and all(data)
        return Answer(ok, status, text[:500], data)

    async def configure_logging(
        self, url: str, fields: Mapping[str, Any], *, keys: ServerKeys, timeout_s: float
    ) -> Answer:
        """``POST /configure_logging``: an empty 200 (no read-back)."""
        status, data, text = await self._call(
            "POST", url, "/configure_logging", keys=keys, timeout_s=timeout_s, body=dict(fields)
        )
        return Answer(status == 200, status, text[:500], data)

    async def attach_hicache(
        self, url: str, fields: Mapping[str, Any], *, keys: ServerKeys, timeout_s: float
    ) -> Answer:
        """``PUT /hicache/storage-backend`` (``AttachHiCacheStorageReqInput``)."""
        status, data, text = await self._call(
            "PUT",
            url,
            "/hicache/storage-backend",
            keys=keys,
            timeout_s=timeout_s,
            body=dict(fields),
        )
        return Answer(status == 200, status, " ".join(text.split())[:500], data)

    async def detach_hicache(self, url: str, *, keys: ServerKeys, timeout_s: float) -> Answer:
        """``DELETE /hicache/storage-backend``."""
        status, data, text = await self._call(
            "DELETE", url, "/hicache/storage-backend", keys=keys, timeout_s=timeout_s
        )
        return Answer(status == 200, status, " ".join(text.split())[:500], data)

    async def hicache_backend(self, url: str, *, keys: ServerKeys, timeout_s: float) -> Answer:
        """``GET /hicache/storage-backend``: the backend and its settings as SGLang holds them."""
        status, data, text = await self._call(
            "GET", url, "/hicache/storage-backend", keys=keys, timeout_s=timeout_s
        )
        return Answer(status == 200 and isinstance(data, dict), status, text[:500], data)

    async def lora(
        self, url: str, verb: str, body: Mapping[str, Any], *, keys: ServerKeys, timeout_s: float
    ) -> Answer:
        """``POST /load_lora_adapter`` or ``/unload_lora_adapter`` (``verb``: load, unload):
        ``LoRAUpdateOutput`` (success, error_message, loaded_adapters)."""
        status, data, text = await self._call(
            "POST", url, f"/{verb}_lora_adapter", keys=keys, timeout_s=timeout_s, body=dict(body)
        )
        ok = status == 200 and isinstance(data, dict) and bool(data.get("success"))
        detail = str(data.get("error_message") or "") if isinstance(data, dict) else text[:500]
        return Answer(ok, status, detail, data)

    async def update_weights(
        self, url: str, body: Mapping[str, Any], *, keys: ServerKeys, timeout_s: float
    ) -> Answer:
        """``POST /update_weights_from_disk`` (``UpdateWeightFromDiskReqInput``): SGLang
        waits for the requests in flight, holds new ones and loads the weights in place."""
        status, data, text = await self._call(
            "POST",
            url,
            "/update_weights_from_disk",
            keys=keys,
            timeout_s=timeout_s,
            body=dict(body),
        )
        ok = status == 200 and isinstance(data, dict) and bool(data.get("success"))
        detail = str(data.get("message") or "") if isinstance(data, dict) else text[:500]
        return Answer(ok, status, detail, data)

    async def read(self, url: str, path: str, *, keys: ServerKeys, timeout_s: float) -> Answer:
        """A read-back (``/server_info``, ``/model_info``) as a JSON object."""
        status, data, text = await self._call("GET", url, path, keys=keys, timeout_s=timeout_s)
        return Answer(status == 200 and isinstance(data, dict), status, text[:300], data)

    async def aclose(self) -> None:
        await self._client.aclose()
