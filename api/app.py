"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from api import page, plan, routes
from api.auth import ApiAccess, GuardMiddleware
from api.openapi import build_openapi
from api.starting import StartingMiddleware
from supervisor.engine import Supervisor
from supervisor.metrics import SupervisorMetrics
from supervisor.oplog import log_operation_end
from supervisor.version import version


def create_app(
    supervisor: Supervisor,
    *,
    token: str | None = None,
    metrics_public: bool = False,
    max_body_bytes: int = 1 << 20,
) -> FastAPI:
    """An app serving ``supervisor`` (started and stopped by ``api.daemon.serve``); with
    ``token`` every call but /healthz (and /metrics when ``metrics_public``) needs it."""
    app = FastAPI(
        title="sglang-supervisor",
        summary="Owns an SGLang server and changes its launch flags atomically.",
        version=version(),
        # /docs is our own page (api/static/docs.html): FastAPI's loads Swagger UI from a CDN.
        docs_url=None,
        redoc_url=None,
    )
    app.state.supervisor = supervisor
    app.state.metrics = SupervisorMetrics(supervisor)
    app.state.access = ApiAccess(token=token, metrics_public=metrics_public)
    #: Set when the daemon stops: open event streams end (see ``close_streams``).
    app.state.closing = asyncio.Event()
    supervisor.on_operation_end.append(log_operation_end)
    app.include_router(routes.router)
    app.include_router(plan.router)
    app.include_router(page.router)

    def openapi() -> dict[str, Any]:
        return build_openapi(app, version())

    app.openapi = openapi  # type: ignore[method-assign]
    # Inside the guard: a call is authenticated before it is told to come back later.
    app.add_middleware(StartingMiddleware, supervisor=supervisor)
    app.add_middleware(GuardMiddleware, access=app.state.access, max_body_bytes=max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # One error shape for every 4xx (api.responses.Problem): each refused field as a
        # problem, without its "input" (it may be large, or not JSON-encodable: NaN).
        problems = [
            {
                "lever": ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "request",
                "message": str(e.get("msg", "")),
                "type": e.get("type"),
            }
            for e in exc.errors()
        ]
        detail = {"message": "the request was refused; nothing was changed", "problems": problems}
        return JSONResponse({"detail": detail}, status_code=422)

    return app


def close_streams(app: FastAPI) -> None:
    """End every open ``/events`` stream now (the daemon is stopping): the API server's
    shutdown then has no long-lived response to wait out or cancel."""
    closing: asyncio.Event = app.state.closing
    closing.set()
