"""The FastAPI application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api import routes
from supervisor.core import Supervisor
from supervisor.metrics import SupervisorMetrics


def create_app(supervisor: Supervisor, *, manage_lifecycle: bool = True) -> FastAPI:
    """An app serving ``supervisor``.

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
                await supervisor.shutdown()

    app = FastAPI(
        title="sglang-supervisor",
        summary="Owns an SGLang server and changes its launch flags atomically.",
        lifespan=lifespan,
    )
    app.state.supervisor = supervisor
    app.state.metrics = SupervisorMetrics(supervisor)
    app.include_router(routes.router)
    return app
