"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sglang_supervisor.engine import Supervisor
from sglang_supervisor.observe.metrics import SupervisorMetrics
from sglang_supervisor.observe.oplog import log_operation_end
from sglang_supervisor.version import version
from sglang_supervisor_api import event_routes, history_routes, page, plan, reconcile, routes
from sglang_supervisor_api.auth import ApiAccess, GuardMiddleware
from sglang_supervisor_api.body_limits import BodyLimitsMiddleware
from sglang_supervisor_api.openapi import build_openapi
from sglang_supervisor_api.request_guard import BrowserGuardMiddleware, HostPolicy, known_query
from sglang_supervisor_api.starting import StartingMiddleware


def create_app(
    supervisor: Supervisor,
    *,
    token: str | None = None,
    read_token: str | None = None,
    metrics_public: bool = False,
    max_body_bytes: int = 1 << 20,
    body_timeout_s: float = 10.0,
    bind_host: str = "127.0.0.1",
    allowed_hosts: tuple[str, ...] = (),
) -> FastAPI:
    """An app serving ``supervisor`` (started and stopped by
    ``sglang_supervisor_api.daemon.serve``); with ``token`` every call but /healthz (and /metrics
    when ``metrics_public``) needs it, or ``read_token`` for the calls that change nothing
    (``sglang_supervisor_api.auth``). ``bind_host`` and ``allowed_hosts``: the Host headers
    it answers (sglang_supervisor_api.request_guard)."""
    app = FastAPI(
        title="sglang-supervisor",
        summary="Owns an SGLang server and changes its launch flags atomically.",
        version=version(),
        # /docs is our own page (api/static/docs.html): FastAPI's loads Swagger UI from a CDN.
        docs_url=None,
        redoc_url=None,
        # Every route refuses a query parameter it does not declare (issue 19 §2).
        dependencies=[Depends(known_query)],
    )
    app.state.supervisor = supervisor
    app.state.metrics = SupervisorMetrics(supervisor)
    app.state.access = ApiAccess(token=token, read_token=read_token, metrics_public=metrics_public)
    #: Set when the daemon stops: open event streams end (see ``close_streams``).
    app.state.closing = asyncio.Event()
    supervisor.on_operation_end.append(log_operation_end)
    app.include_router(routes.router)
    app.include_router(event_routes.router)
    app.include_router(history_routes.router)
    app.include_router(plan.router)
    app.include_router(reconcile.router)
    app.include_router(page.router)

    def openapi() -> dict[str, Any]:
        return build_openapi(app, version())

    app.openapi = openapi  # type: ignore[method-assign]
    # Inside the guard: a call is authenticated before it is told to come back later.
    app.add_middleware(StartingMiddleware, supervisor=supervisor)
    # Inside the token check: a caller without the token cannot make the daemon read a body.
    app.add_middleware(
        BodyLimitsMiddleware, max_body_bytes=max_body_bytes, body_timeout_s=body_timeout_s
    )
    app.add_middleware(GuardMiddleware, access=app.state.access)
    # Outermost (added last): a forged browser request is refused before the token check.
    app.add_middleware(BrowserGuardMiddleware, hosts=HostPolicy(bind_host, allowed_hosts))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI's own errors carry a bare string ("There was an error parsing the body":
        # invalid UTF-8, nesting too deep): the documented shape says what to do.
        detail: Any = exc.detail
        if not isinstance(detail, dict):
            detail = {"message": _plain_message(exc.status_code, str(detail))}
        return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # One error shape for every 4xx (sglang_supervisor_api.responses.Problem): each refused
        # field as a problem, without its "input" (it may be large, or not JSON-encodable: NaN).
        problems = [_problem(e) for e in exc.errors()]
        detail = {"message": "the request was refused; nothing was changed", "problems": problems}
        return JSONResponse({"detail": detail}, status_code=422)

    return app


def _problem(e: Any) -> dict[str, Any]:
    if e.get("type") == "json_invalid":
        # Pydantic says "JSON decode error" at ("body", <character>): which character, what
        # was wrong there, what to send instead.
        loc = tuple(e.get("loc", ()))
        at = f" at character {loc[1]}" if len(loc) > 1 else ""
        why = (e.get("ctx") or {}).get("error") or "not JSON"
        return {
            "lever": "body",
            "message": f"the body is not valid JSON ({why}{at}); send a JSON object, "
            "e.g. curl -d '{}' (nothing was changed)",
            "type": "json_invalid",
        }
    return {
        "lever": ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "request",
        "message": str(e.get("msg", "")),
        "type": e.get("type"),
    }


def _plain_message(status: int, text: str) -> str:
    if status == 400:
        return (
            f"{text}: the body must be JSON in UTF-8 (nested at most a few hundred levels); "
            "nothing was changed"
        )
    return text


def close_streams(app: FastAPI) -> None:
    """End every open ``/events`` stream now (the daemon is stopping): the API server's
    shutdown then has no long-lived response to wait out or cancel."""
    closing: asyncio.Event = app.state.closing
    closing.set()
