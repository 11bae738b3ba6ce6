"""The control API's routes. Handlers only translate HTTP to Supervisor calls and back."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse

from sglang_supervisor.engine import (
    Busy,
    NoSuchOperation,
    NotCancellable,
    OperationFinished,
    Supervisor,
)
from sglang_supervisor.observe.metrics import SupervisorMetrics
from sglang_supervisor.observe.serverlogs import log_for_launch
from sglang_supervisor.observe.telemetry import tail_lines
from sglang_supervisor.operations import Operation
from sglang_supervisor.redact import REDACTED, redact, redact_text
from sglang_supervisor.sglang.drift import hides_value
from sglang_supervisor.sglang.levers import LeverError
from sglang_supervisor.sglang.live import LiveSet
from sglang_supervisor.states import ServerState
from sglang_supervisor.version import version
from sglang_supervisor_api.audit import audit
from sglang_supervisor_api.models import ApplyRequest
from sglang_supervisor_api.responses import (
    BUSY,
    INVALID,
    NOT_FOUND,
    RETRY_AFTER_S,
    Health,
    LeversAnswer,
    OperationEnvelope,
    OperationList,
    PrometheusResponse,
    Readiness,
    StatusAnswer,
    problem,
)


def get_supervisor(request: Request) -> Supervisor:
    sup: Supervisor = request.app.state.supervisor
    return sup


def get_metrics(request: Request) -> SupervisorMetrics:
    metrics: SupervisorMetrics = request.app.state.metrics
    return metrics


SupervisorDep = Annotated[Supervisor, Depends(get_supervisor)]
MetricsDep = Annotated[SupervisorMetrics, Depends(get_metrics)]
WaitQuery = Annotated[bool, Query(description="answer when the operation has ended")]

router = APIRouter()


#: The answers of the routes that start an operation (POST /levers, /stop, /start, /restart).
OPERATION_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {"model": OperationEnvelope, "description": "the operation has ended (?wait=true)"},
    202: {"model": OperationEnvelope, "description": "the operation runs; follow its id"},
    409: BUSY,
}


def _busy(exc: Busy) -> HTTPException:
    return HTTPException(
        status_code=409,
        detail={"message": str(exc), "operation": exc.operation.id},
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


async def _answer(op: Operation, wait: bool) -> JSONResponse:
    if wait:
        await op.done.wait()
    code = 200 if op.finished else 202
    return JSONResponse({"operation": redact(op.to_json())}, status_code=code)


@router.get("/healthz", response_model=Health)
async def healthz(sup: SupervisorDep) -> dict[str, Any]:
    """The daemon itself is alive (says nothing about the SGLang server). No token."""
    view = sup.view()
    return {"ok": True, "state": str(view.state), "version": version(), "loading": view.loading}


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "the server is not ready"}},
)
async def readyz(sup: SupervisorDep) -> JSONResponse:
    """200 only while the SGLang server is ready (answered /health_generate) and not on
    probation; 503 while it starts, is on probation (a new server of an apply, not yet
    committed), drains, stops, is in backoff or failed, or is stopped. No token: for load
    balancers and Kubernetes readiness probes."""
    view = sup.view()
    ready = view.state == ServerState.READY and view.probation is None
    reason = view.state_reason
    if view.probation is not None:
        reason = f"on probation until {view.probation['until']}: {reason}"
    body = {"ready": ready, "state": str(view.state), "reason": reason}
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/status", response_model=StatusAnswer, response_model_exclude_unset=True)
async def status(sup: SupervisorDep) -> dict[str, Any]:
    """The server's state and its reason, the server, levers against last-good, the GPUs
    (memory, baseline, processes), the running and last operation, restarts, the load."""
    return {"version": version(), **redact(await sup.status())}


@router.get("/levers", response_model=LeversAnswer, response_model_exclude_unset=True)
async def get_levers(sup: SupervisorDep) -> dict[str, Any]:
    """The current levers and environment, beside the last-good set."""
    view = sup.view()
    return redact(
        {
            "levers": dict(view.levers.levers),
            "env": dict(view.levers.env),
            "last_good": None if view.last_good is None else view.last_good.to_json(),
        }
    )


@router.get("/levers/schema")
async def levers_schema(
    sup: SupervisorDep,
    q: Annotated[
        str | None, Query(description="only flags whose name or help mention this")
    ] = None,
) -> dict[str, Any]:
    """The installed SGLang's flags (or the bundled schema, see ``source``)."""
    view = sup.view()
    flags = view.schema.search(q)
    changed_live = LiveSet.of(view.schema)
    return {
        "sglang_version": view.schema.sglang_version,
        "source": view.schema.source,
        "live": view.schema_live,
        # Which flags SGLang changes on a running server (no restart), and how.
        "live_levers": changed_live.to_json(),
        "count": len(flags),
        "flags": [{**f.to_json(), "live_via": changed_live.via(f.dest)} for f in flags],
    }


@router.post(
    "/levers",
    status_code=202,
    response_model=OperationEnvelope,
    responses={**OPERATION_ANSWERS, 422: INVALID},
)
async def post_levers(
    request: Request,
    body: ApplyRequest,
    sup: SupervisorDep,
    wait: WaitQuery = False,
    dry_run: Annotated[
        bool | None, Query(description="validate and preflight only (as body.dry_run)")
    ] = None,
) -> Any:
    """Validate, preflight, then stop -> release -> start -> commit, or roll back."""
    body = _with_query_dry_run(body, dry_run)
    requested = sup.requested_levers(body.levers, body.env, replace=body.replace)
    diff = redact(sup.view().levers.diff(requested))
    try:
        op = await sup.submit_apply(
            body.levers,
            body.env,
            replace=body.replace,
            dry_run=body.dry_run,
            drain_timeout_s=body.drain_timeout_s,
            force_restart=body.force_restart,
            without_router=body.without_router,
            effect_guard=body.effect_guard,
        )
    except LeverError as exc:
        # A refused set is as it was sent: a misspelt secret (api-kye, env.hf_token) is
        # not secret-named, and the audit log goes to the journal too.
        schema = sup.view().schema
        hidden = {
            k: {side: REDACTED if v is not None else None for side, v in change.items()}
            if hides_value(k, schema) and isinstance(change, dict)
            else change
            for k, change in diff.items()
        }
        audit(
            request.scope,
            "apply",
            outcome="refused",
            diff=hidden,
            problems=redact([p.to_json() for p in exc.problems]),
        )
        raise HTTPException(
            status_code=422,
            detail={
                "message": "the lever set was refused; nothing was changed",
                "problems": redact([p.to_json() for p in exc.problems]),
            },
        ) from exc
    except Busy as exc:
        audit(request.scope, "apply", outcome="busy", diff=diff, running=exc.operation.id)
        raise _busy(exc) from exc
    audit(
        request.scope, "apply", outcome="accepted", operation=op.id, diff=diff, dry_run=body.dry_run
    )
    return await _answer(op, wait)


def _with_query_dry_run(body: ApplyRequest, query: bool | None) -> ApplyRequest:
    """``?dry_run=`` and ``body.dry_run`` are one switch: either sets it; both must agree."""
    if query is None:
        return body
    if "dry_run" in body.model_fields_set and body.dry_run != query:
        raise RequestValidationError(
            [
                {
                    "loc": ("query", "dry_run"),
                    "msg": f"?dry_run={str(query).lower()} contradicts the body's dry_run "
                    f"{str(body.dry_run).lower()}; give it once. Nothing was done",
                    "type": "value_error",
                }
            ]
        )
    return body.model_copy(update={"dry_run": query})


@router.get("/operations", response_model=OperationList, response_model_exclude_unset=True)
async def list_operations(
    sup: SupervisorDep,
    limit: Annotated[int, Query(ge=1, le=200, description="at most this many")] = 20,
) -> dict[str, Any]:
    """Recent operations, newest first (the daemon keeps the last 200)."""
    ops = list(sup.operations.values())[-limit:]
    return {"operations": [redact(op.to_json()) for op in reversed(ops)]}


@router.get(
    "/operations/{op_id}",
    response_model=OperationEnvelope,
    response_model_exclude_unset=True,
    responses={404: NOT_FOUND},
)
async def get_operation(op_id: str, sup: SupervisorDep) -> dict[str, Any]:
    """One operation with its phases, in the envelope POST answers use."""
    op = sup.get_operation(op_id)
    if op is None:
        raise HTTPException(
            404, detail={"message": f"no operation {op_id!r} (the daemon keeps the last 200)"}
        )
    return {"operation": redact(op.to_json())}


@router.post(
    "/operations/{op_id}/cancel",
    status_code=202,
    response_model=OperationEnvelope,
    responses={
        **OPERATION_ANSWERS,
        404: NOT_FOUND,
        409: problem(
            "the operation has already ended, or is rolling back and cannot be cancelled "
            "(it is in detail.operation)"
        ),
    },
)
async def cancel_operation(
    request: Request, op_id: str, sup: SupervisorDep, wait: WaitQuery = False
) -> JSONResponse:
    """End a running operation at its next phase boundary: a hung start or a long drain
    stops waiting and rolls back (see ``Supervisor.request_cancel``). 404 unknown id;
    409 when it has already ended, or when its rollback (or containment) has begun: a
    cancel then would tear down the last-good server being started."""
    try:
        op = sup.request_cancel(op_id)
    except NoSuchOperation as exc:
        audit(request.scope, "cancel", outcome="unknown", operation=op_id)
        raise HTTPException(404, detail={"message": str(exc)}) from exc
    except (OperationFinished, NotCancellable) as exc:
        outcome = "finished" if isinstance(exc, OperationFinished) else "not_cancellable"
        audit(request.scope, "cancel", outcome=outcome, operation=op_id)
        raise HTTPException(
            409, detail={"message": str(exc), "operation": redact(exc.operation.to_json())}
        ) from exc
    audit(request.scope, "cancel", outcome="accepted", operation=op.id)
    return await _answer(op, wait)


async def _control(request: Request, sup: Supervisor, kind: str, wait: bool) -> JSONResponse:
    try:
        if kind == "stop":
            op = sup.submit_stop()
        elif kind == "start":
            op = await sup.submit_start()
        else:
            op = await sup.submit_restart()
    except Busy as exc:
        audit(request.scope, kind, outcome="busy", running=exc.operation.id)
        raise _busy(exc) from exc
    except LeverError as exc:  # preflight: the server was not touched
        problems = redact([p.to_json() for p in exc.problems])
        audit(request.scope, kind, outcome="refused", problems=problems)
        raise HTTPException(
            status_code=422,
            detail={
                "message": f"{kind} refused by preflight; nothing was changed",
                "problems": problems,
            },
        ) from exc
    audit(request.scope, kind, outcome="accepted", operation=op.id)
    return await _answer(op, wait)


@router.post(
    "/stop", status_code=202, response_model=OperationEnvelope, responses=OPERATION_ANSWERS
)
async def stop(request: Request, sup: SupervisorDep, wait: WaitQuery = False) -> JSONResponse:
    """SIGTERM the server, SIGKILL after the grace period, verify the GPUs released."""
    return await _control(request, sup, "stop", wait)


@router.post(
    "/start", status_code=202, response_model=OperationEnvelope, responses=OPERATION_ANSWERS
)
async def start(request: Request, sup: SupervisorDep, wait: WaitQuery = False) -> JSONResponse:
    """Start the server with the current levers (after the same preflight as an apply)."""
    return await _control(request, sup, "start", wait)


@router.post(
    "/restart", status_code=202, response_model=OperationEnvelope, responses=OPERATION_ANSWERS
)
async def restart(request: Request, sup: SupervisorDep, wait: WaitQuery = False) -> JSONResponse:
    """Stop, verify the GPUs released, start with the same levers."""
    return await _control(request, sup, "restart", wait)


@router.get(
    "/metrics",
    response_class=PrometheusResponse,
    responses={200: {"description": "the Prometheus text exposition format"}},
)
async def metrics(registry: MetricsDep, sup: SupervisorDep) -> PrometheusResponse:
    """Prometheus exposition; GPU memory is sampled now (in a worker thread). No token
    with ``[api] metrics_public = true``."""
    body = await asyncio.to_thread(registry.render, sup.view())
    return PrometheusResponse(body)


def _redacted_tail(path: Path, tail: int) -> list[str]:
    return [redact_text(line) for line in tail_lines(path, tail, 16 * 1024 * 1024)]


@router.get(
    "/logs",
    response_class=PlainTextResponse,
    responses={
        200: {"description": "the lines; the X-Log-Path header names the file"},
        404: NOT_FOUND,
    },
)
async def logs(
    sup: SupervisorDep,
    tail: Annotated[int, Query(ge=0, le=100_000)] = 100,
    launch: Annotated[
        int, Query(ge=0, description="0 = the newest launch, 1 = the one before")
    ] = 0,
) -> PlainTextResponse:
    """The server's last ``tail`` log lines of one launch, as text, secrets hidden (SGLang
    prints its ``server_args``, ``api_key`` included: the file keeps them, this does not)."""
    path = await asyncio.to_thread(log_for_launch, sup.view().logs_dir, launch)
    if path is None:
        raise HTTPException(404, detail={"message": f"no log of launch {launch} (0 = newest)"})
    lines = await asyncio.to_thread(_redacted_tail, path, tail)
    return PlainTextResponse(
        "\n".join(lines) + ("\n" if lines else ""), headers={"X-Log-Path": str(path)}
    )
