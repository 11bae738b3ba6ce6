"""The daemon's HTTP API in-process: ``sglang_supervisor_api.app.create_app`` over a Supervisor on
fakes (``tests.unit.fakes``), called through httpx's ASGI transport - no daemon process, no
socket, no simulated server. For tests of what the API answers (codes, bodies, auth,
limits, the OpenAPI document); what needs real processes, signals or a socket stays in
``tests/integration`` with a real ``serve --simulate``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from sglang_supervisor_api.app import create_app
from tests.unit.fakes import Rig, make_rig


@asynccontextmanager
async def api_client(
    tmp: Path,
    *,
    token: str | None = None,
    metrics_public: bool = False,
    max_body_bytes: int = 1 << 20,
    ready: bool = True,
    **rig_kw: Any,
) -> AsyncIterator[tuple[httpx.AsyncClient, Rig, FastAPI]]:
    """A client of the app (sending ``token`` when given), the rig under it, the app.
    With ``ready`` the supervisor has started its fake server first."""
    rig = make_rig(tmp, **rig_kw)
    if ready:
        await rig.start_ready()
    app = create_app(
        rig.sup, token=token, metrics_public=metrics_public, max_body_bytes=max_body_bytes
    )
    headers = {"Content-Type": "application/json"}  # what the daemon needs on a POST
    if token:
        headers["Authorization"] = f"Bearer {token}"
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50123))
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://sglang-supervisor.test", headers=headers
        ) as client:
            yield client, rig, app
    finally:
        await rig.sup.shutdown()
