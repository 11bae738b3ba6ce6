"""The config file as the levers' desired state: ``POST /reconcile``, and what a SIGHUP
does with ``[server.levers]``.

The daemon, never the client, reads the config (the CLI may run on another host): a
reconcile first re-reads the file the daemon was started with (``--config``, the
environment's overrides included: the same loader as a SIGHUP), takes its
``[server.levers]``, ``[server.env]`` and ``server.levers_source`` as the desired state
(``Supervisor.take_config``: /status's ``drift`` follows), then applies them as
one operation (``Supervisor.submit_reconcile``). A SIGHUP re-reads them too; with
``levers_source = "config"`` it then reconciles (``after_sighup``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from sglang_supervisor.config import Settings
from sglang_supervisor.engine import Busy, Supervisor
from sglang_supervisor.engine.checks import RETRYING
from sglang_supervisor.redact import redact
from sglang_supervisor.sglang.levers import LeverError
from sglang_supervisor.states import ServerState
from sglang_supervisor_api.audit import audit
from sglang_supervisor_api.responses import BUSY, INVALID, OperationEnvelope
from sglang_supervisor_api.routes import OPERATION_ANSWERS, SupervisorDep, WaitQuery, _answer

log = logging.getLogger("supervisor")
router = APIRouter()

#: ``app.state.load_settings``: re-reads the daemon's config (None: none to re-read).
LoadSettings = Callable[[], Settings]


class ReconcileRequest(BaseModel):
    """``POST /reconcile`` (the body may be left out)."""

    model_config = ConfigDict(extra="forbid")

    #: Validate and preflight the config's levers only; also ``?dry_run=true``.
    dry_run: StrictBool = False
    #: Wait up to this long for running and queued requests to finish before the stop.
    drain_timeout_s: float = Field(0.0, ge=0, allow_inf_nan=False)


def reread(sup: Supervisor, new: Settings) -> list[str]:
    """Take ``new``'s levers as the desired state (on the loop); what changed."""
    return sup.take_config(new.server)


@router.post(
    "/reconcile",
    status_code=202,
    response_model=OperationEnvelope,
    responses={**OPERATION_ANSWERS, 409: BUSY, 422: INVALID},
)
async def post_reconcile(
    request: Request,
    sup: SupervisorDep,
    body: ReconcileRequest | None = None,
    wait: WaitQuery = False,
    dry_run: Annotated[
        bool | None, Query(description="validate and preflight only (as body.dry_run)")
    ] = None,
) -> JSONResponse:
    """Re-read the config file and apply its ``[server.levers]`` and ``[server.env]``
    (replacing the current set) as one operation: validate, preflight, then stop ->
    release -> start -> commit, or roll back; a server already serving them is not
    restarted. 422 when the config does not load or its levers are refused (nothing
    changed); 409 busy."""
    body = body or ReconcileRequest()
    if dry_run is not None:
        # One switch, as POST /levers: given twice, both must say the same.
        if "dry_run" in body.model_fields_set and body.dry_run != dry_run:
            raise RequestValidationError(
                [
                    {
                        "loc": ("query", "dry_run"),
                        "msg": f"?dry_run={str(dry_run).lower()} contradicts the body's "
                        f"dry_run {str(body.dry_run).lower()}; give it once. Nothing was done",
                        "type": "value_error",
                    }
                ]
            )
        body = body.model_copy(update={"dry_run": dry_run})
    load: LoadSettings | None = getattr(request.app.state, "load_settings", None)
    if load is not None:
        try:
            new = await asyncio.to_thread(load)
        except ValueError as exc:
            audit(request.scope, "reconcile", outcome="refused", problems=[str(exc)])
            raise HTTPException(
                422,
                detail={
                    "message": f"the config does not load, nothing was changed: {exc}",
                    "problems": [{"lever": "config", "message": str(exc)}],
                },
            ) from exc
        changed = reread(sup, new)
        if changed:
            log.info("reconcile: the config was re-read: %s", "; ".join(changed))
    view = sup.view()
    config = view.desired.config if view.desired is not None else view.levers
    diff = redact(view.levers.diff(sup.requested_levers(config.levers, config.env, replace=True)))
    try:
        op = await sup.submit_reconcile("POST /reconcile", body.dry_run, body.drain_timeout_s)
    except LeverError as exc:
        problems = redact([p.to_json() for p in exc.problems])
        audit(request.scope, "reconcile", outcome="refused", problems=problems)
        raise HTTPException(
            422,
            detail={
                "message": "the config's levers were refused; nothing was changed. Fix "
                "[server.levers]/[server.env] in the daemon's config",
                "problems": problems,
            },
        ) from exc
    except Busy as exc:
        audit(request.scope, "reconcile", outcome="busy", running=exc.operation.id)
        raise HTTPException(
            409,
            detail={"message": str(exc), "operation": exc.operation.id},
            headers={"Retry-After": "5"},
        ) from exc
    audit(
        request.scope,
        "reconcile",
        outcome="accepted",
        operation=op.id,
        dry_run=body.dry_run,
        diff=diff,
    )
    return await _answer(op, wait)


def on_sighup(sup: Supervisor) -> Callable[[Settings], list[str]]:
    """``after_sighup`` for ``sup``, keeping its reconcile tasks referenced until they end
    (the reload's ``on_new``)."""
    tasks: set[asyncio.Task[Any]] = set()
    return lambda new: after_sighup(sup, new, tasks)


def after_sighup(sup: Supervisor, new: Settings, tasks: set[asyncio.Task[Any]]) -> list[str]:
    """A SIGHUP re-read the config into ``new`` (on the loop): take its levers as the
    desired state; with ``levers_source = "config"`` reconcile the server to them (an
    operation, started here and kept in ``tasks``; not while the daemon still starts, nor
    for a server an operator stopped: a reload does not start it; a refusal is in
    /status's warnings and ``levers_config.last_reconcile``). Returns what changed."""
    changed = reread(sup, new)
    view = sup.view()
    loading = view.loading
    # Stopped with no operation running: an operator's stop (POST /stop, or a cancelled
    # start-up), which holds until an operator starts the server. A reload (a certificate
    # renewal's `systemctl reload`...) is not one: the reconcile would start it.
    stopped = view.state == ServerState.STOPPED and view.operation is None
    if new.server.levers_source == "config" and loading is not None:
        # No operation may run yet; the start-up launches the config's levers unless it
        # had chosen its levers already: then a reconcile once it is up applies these.
        log.warning(
            "reconcile (SIGHUP) not run: the daemon is still starting (loading %s); "
            "`sglang-supervisor reconcile` once it is up applies the config",
            loading,
        )
    elif new.server.levers_source == "config" and stopped:
        log.warning(
            "reconcile (SIGHUP) not run: the server was stopped by an operator (%s) and "
            "stays stopped; `sglang-supervisor reconcile` applies the config and starts it",
            view.state_reason,
        )
    elif new.server.levers_source == "config":
        for older in tasks:  # this SIGHUP's config replaces theirs: one reconcile waits
            older.cancel()
        task = asyncio.ensure_future(_reconcile_on_sighup(sup))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    return changed


#: How often a reconcile waiting for a retrying launch looks at its state again.
WAIT_POLL_S = 0.05


async def _reconcile_on_sighup(sup: Supervisor) -> None:
    """Submit the reconcile. Busy with an operation that retries a failing launch (the
    start-up's, or a recovery's: ``checks.RETRYING``), it waits for that operation's next
    backoff, which yields to it, or its end, and submits again: the edited config may be
    what ends a crash loop (it was refused as busy for the whole loop). Busy with any
    other operation (an operator's), it is refused as before; a later SIGHUP replaces a
    reconcile still waiting."""
    while True:
        try:
            op = await sup.submit_reconcile("SIGHUP", dry_run=False, drain_s=0.0)
        except Busy as exc:
            running = exc.operation
            if running.kind not in RETRYING or running.finished:
                return  # logged and shown in /status by engine/desired.py
            log.info(
                "reconcile (SIGHUP): operation %s (%s) retries a failing launch; the "
                "reconcile follows at its next backoff or its end",
                running.id,
                running.kind,
            )
            # Refused in a backoff (it did not yield): the next one, never this one again.
            stale = sup.view().state == ServerState.BACKOFF
            while not running.finished:
                await asyncio.sleep(WAIT_POLL_S)
                backing_off = sup.view().state == ServerState.BACKOFF
                if backing_off and not stale:
                    break
                stale = stale and backing_off
            continue
        except LeverError:
            return  # logged and shown in /status by engine/desired.py
        except Exception:  # a task nobody awaits: say it here, not as "never retrieved"
            log.exception("reconcile (SIGHUP) failed; the server was not touched by it")
            return
        log.info("reconcile (SIGHUP): operation %s", op.id)
        return
