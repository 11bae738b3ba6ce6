"""The supervisor reads /server_info, which SGLang 0.5.23 prefers over the deprecated
/get_server_info (sglang/srt/entrypoints/http_server.py:853-863)."""

from __future__ import annotations

import asyncio

import httpx

from sglang_supervisor.observe.health import HttpHealthChecker


def _read(routes: dict[str, dict[str, int]]) -> tuple[dict[str, object], list[str]]:
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        body = routes.get(request.url.path)
        return httpx.Response(404) if body is None else httpx.Response(200, json=body)

    async def go() -> dict[str, object]:
        checker = HttpHealthChecker()
        checker._client = httpx.AsyncClient(transport=httpx.MockTransport(handle))
        try:
            return await checker.server_info("http://server", 5.0)
        finally:
            await checker.aclose()

    return asyncio.run(go()), seen


def test_server_info_is_read_first() -> None:
    info, seen = _read({"/server_info": {"v": 1}, "/get_server_info": {"v": 0}})
    assert info == {"v": 1} and seen == ["/server_info"]


def test_an_older_server_falls_back_to_get_server_info() -> None:
    info, seen = _read({"/get_server_info": {"v": 0}})
    assert info == {"v": 0} and seen == ["/server_info", "/get_server_info"]
