"""Readiness and liveness probes against SGLang's HTTP API.

Ready means ``GET /health_generate`` answered 200: it runs a real generation, where
``/health`` can answer 200 from a hung server. Then ``GET /server_info`` is read for
``max_total_num_tokens`` and the resolved arguments (SGLang 0.5.23 deprecates
``/get_server_info``, ``entrypoints/http_server.py:853-863``; it is the fallback on a 404).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx


@dataclass(frozen=True)
class Probe:
    ok: bool
    detail: str


class HealthChecker(Protocol):
    async def generate_ok(self, url: str, timeout_s: float) -> Probe: ...

    async def server_info(
        self, url: str, timeout_s: float, headers: Mapping[str, str] | None = None
    ) -> dict[str, Any]: ...

    async def metrics_text(self, url: str, timeout_s: float) -> str | None: ...

    async def aclose(self) -> None: ...


class HttpHealthChecker:
    """The real probes, over one pooled ``httpx.AsyncClient`` (loopback, no proxies)."""

    def __init__(self) -> None:
        self._client = httpx.AsyncClient(trust_env=False)

    async def generate_ok(self, url: str, timeout_s: float) -> Probe:
        try:
            r = await self._client.get(f"{url}/health_generate", timeout=timeout_s)
        except httpx.TimeoutException:
            return Probe(False, f"GET {url}/health_generate timed out after {timeout_s:.0f}s")
        except httpx.HTTPError as exc:
            return Probe(False, f"GET {url}/health_generate failed: {type(exc).__name__}: {exc}")
        if r.status_code == 200:
            return Probe(True, "200")
        return Probe(False, f"GET {url}/health_generate answered {r.status_code}")

    async def server_info(
        self, url: str, timeout_s: float, headers: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """``/server_info`` (``/get_server_info`` on an older server that answers 404) as a
        dict, sent with ``headers`` (the key SGLang wants there: the caller's,
        ``sglang.auth``); raises ``httpx.HTTPError`` when it fails."""
        bearer = dict(headers or {})
        r = await self._client.get(f"{url}/server_info", timeout=timeout_s, headers=bearer)
        if r.status_code == 404:
            r = await self._client.get(f"{url}/get_server_info", timeout=timeout_s, headers=bearer)
        r.raise_for_status()
        data = r.json()
        return data if isinstance(data, dict) else {}

    async def metrics_text(self, url: str, timeout_s: float) -> str | None:
        """The server's ``/metrics`` exposition, or None when it does not answer 200."""
        try:
            r = await self._client.get(f"{url}/metrics", timeout=timeout_s)
        except httpx.HTTPError:
            return None
        return r.text if r.status_code == 200 else None

    async def aclose(self) -> None:
        await self._client.aclose()
