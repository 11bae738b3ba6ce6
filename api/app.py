"""The FastAPI application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api import plan, routes
from api.auth import GuardMiddleware
from supervisor.core import Supervisor
from supervisor.metrics import SupervisorMetrics


def create_app(
    supervisor: Supervisor,
    *,
    manage_lifecycle: bool = True,
    token: str | None = None,
    metrics_public: bool = False,
    max_body_bytes: int = 1 << 20,
    keep_server: bool = False,
) -> FastAPI:
    """An app serving ``supervisor``; with ``token`` every call but /healthz needs it.

    With ``manage_lifecycle`` the app's lifespan starts the supervisor and, on shutdown
    (the daemon's SIGTERM/SIGINT), stops the server and verifies the GPUs released.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if manage_lifecycle:
            await supervisor.start()
        try:
            yield
        finally:
            if manage_lifecycle:
                await supervisor.shutdown(keep_server=keep_server)

    app = FastAPI(
        title="sglang-supervisor",
        summary="Owns an SGLang server and changes its launch flags atomically.",
        lifespan=lifespan,
    )
    app.state.supervisor = supervisor
    app.state.metrics = SupervisorMetrics(supervisor)
    app.include_router(routes.router)
    app.include_router(plan.router)
    app.add_middleware(
        GuardMiddleware,
        token=token,
        metrics_public=metrics_public,
        max_body_bytes=max_body_bytes,
    )
    return app
