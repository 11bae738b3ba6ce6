"""The control API's routes. Handlers only translate HTTP to Supervisor calls and back."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import JSONResponse

from api.models import ApplyRequest
from supervisor.core import Busy, Supervisor
from supervisor.levers import LeverError
from supervisor.operations import Operation


def get_supervisor(request: Request) -> Supervisor:
    sup: Supervisor = request.app.state.supervisor
    return sup


SupervisorDep = Annotated[Supervisor, Depends(get_supervisor)]
WaitQuery = Annotated[bool, Query(description="answer when the operation has ended")]

router = APIRouter()


def _busy(exc: Busy) -> HTTPException:
    return HTTPException(
        status_code=409,
        detail={"message": str(exc), "operation": exc.operation.id},
    )


async def _answer(op: Operation, wait: bool) -> JSONResponse:
    if wait:
        await op.done.wait()
    code = 200 if op.finished else 202
    return JSONResponse({"operation": op.to_json()}, status_code=code)


@router.get("/healthz")
async def healthz(sup: SupervisorDep) -> dict[str, Any]:
    """The daemon itself is alive (says nothing about the SGLang server)."""
    return {"ok": True, "state": str(sup.state)}


@router.get("/status")
async def status(sup: SupervisorDep) -> dict[str, Any]:
    return await sup.status()


@router.get("/levers")
async def get_levers(sup: SupervisorDep) -> dict[str, Any]:
    return {
        "levers": dict(sup.levers.levers),
        "env": dict(sup.levers.env),
        "last_good": None if sup.last_good is None else sup.last_good.to_json(),
    }


@router.get("/levers/schema")
async def levers_schema(
    sup: SupervisorDep,
    q: Annotated[
        str | None, Query(description="only flags whose name or help mention this")
    ] = None,
) -> dict[str, Any]:
    """The installed SGLang's flags (or the bundled schema, see ``source``)."""
    flags = sup.schema.search(q)
    return {
        "sglang_version": sup.schema.sglang_version,
        "source": sup.schema.source,
        "live": sup.schema_live,
        "count": len(flags),
        "flags": [f.to_json() for f in flags],
    }


@router.post("/levers", status_code=202)
async def post_levers(body: ApplyRequest, sup: SupervisorDep, wait: WaitQuery = False) -> Any:
    """Validate, preflight, then stop -> release -> start -> commit, or roll back."""
    try:
        op = await sup.submit_apply(
            body.levers,
            body.env,
            replace=body.replace,
            dry_run=body.dry_run,
            drain_timeout_s=body.drain_timeout_s,
        )
    except LeverError as exc:
        raise HTTPException(
            status_code=422,
            detail={
                "message": "the lever set was refused; nothing was changed",
                "problems": [p.to_json() for p in exc.problems],
            },
        ) from exc
    except Busy as exc:
        raise _busy(exc) from exc
    return await _answer(op, wait)


@router.get("/operations/{op_id}")
async def get_operation(op_id: str, sup: SupervisorDep) -> dict[str, Any]:
    op = sup.operations.get(op_id)
    if op is None:
        raise HTTPException(
            404, detail={"message": f"no operation {op_id!r} (the daemon keeps the last 200)"}
        )
    return op.to_json()


async def _control(sup: Supervisor, kind: str, wait: bool) -> JSONResponse:
    submit = {"stop": sup.submit_stop, "start": sup.submit_start, "restart": sup.submit_restart}
    try:
        op = submit[kind]()
    except Busy as exc:
        raise _busy(exc) from exc
    return await _answer(op, wait)


@router.post("/stop", status_code=202)
async def stop(sup: SupervisorDep, wait: WaitQuery = False) -> JSONResponse:
    """SIGTERM the server, SIGKILL after the grace period, verify the GPUs released."""
    return await _control(sup, "stop", wait)


@router.post("/start", status_code=202)
async def start(sup: SupervisorDep, wait: WaitQuery = False) -> JSONResponse:
    return await _control(sup, "start", wait)


@router.post("/restart", status_code=202)
async def restart(sup: SupervisorDep, wait: WaitQuery = False) -> JSONResponse:
    return await _control(sup, "restart", wait)
