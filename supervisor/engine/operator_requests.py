"""An operator's requests to the facade, past their checks of shape: an apply's
validation, preflight and dry run, run as phases of its operation before it becomes the
running one (``submit_apply``), a cancel (``request_cancel``), and the backoff that
yields to either (``preempt_backoff``).
``Supervisor``'s methods of the same names say what each promises.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from sglang_supervisor.engine import checks, downtime, live_change, transaction, weights_change
from sglang_supervisor.engine.errors import (
    Busy,
    NoSuchOperation,
    NotCancellable,
    OperationFinished,
)
from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.paths import choose_path
from sglang_supervisor.engine.record import ReadRecord, ServerRecord
from sglang_supervisor.engine.registry import MAX_OPERATIONS, OperationRegistry
from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.observe.events import EventBus
from sglang_supervisor.operations import SUCCEEDED, Operation
from sglang_supervisor.phases import OpKind
from sglang_supervisor.sglang.levers import LeverError, LeverProblem, LeverSet, canonical_names
from sglang_supervisor.sglang.live import ChangePath
from sglang_supervisor.sglang.schema import FlagSchema

log = logging.getLogger("supervisor")

CANCEL_REASON = "cancelled by an operator (POST /operations/{id}/cancel)"


def preempt_backoff(ops: OperationRegistry, record: ReadRecord) -> None:
    """An operator's request wins over a restart that is only waiting out its backoff."""
    op = ops.current
    if op is not None and checks.backing_off(op, record):
        # Safe to cancel: in backoff the recovery only waits (no OS step runs).
        ops.supersede(op, "superseded by an operator's request during backoff")


def request_cancel(events: EventBus, ops: OperationRegistry, op_id: str) -> Operation:
    """``Supervisor.request_cancel``: ask ``op_id`` to end at its next phase boundary."""
    op = ops.kept.get(op_id)
    if op is None:
        raise NoSuchOperation(
            f"no operation {op_id!r} (the daemon keeps the last {MAX_OPERATIONS})"
        )
    if op.finished:
        raise OperationFinished(op)
    if op.not_cancellable is not None and op.cancelled is None:
        raise NotCancellable(op, op.not_cancellable)  # (a repeat of an honoured one: ok)
    if op.cancel_requested is None and op.cancelled is None:
        op.cancel_requested = CANCEL_REASON.format(id=op.id)
        log.warning("operation %s (%s): cancel requested", op.id, op.kind)
        events.publish("cancel", operation=op.id, op_kind=op.kind)
        op.wake.set()
    return op


def requested_levers(
    schema: FlagSchema,
    current: LeverSet,
    levers: Mapping[str, Any],
    env: Mapping[str, Any],
    *,
    replace: bool = False,
) -> LeverSet:
    """The set a request asks for: its names made canonical, merged onto ``current``."""
    return current.merged(canonical_names(levers, schema), env, replace=replace)


async def submit_apply(
    parts: Parts,
    record: ServerRecord,
    stop: StopRequest,
    ops: OperationRegistry,
    levers: Mapping[str, Any],
    env: Mapping[str, Any],
    *,
    replace: bool,
    dry_run: bool,
    drain_timeout_s: float,
    force_restart: bool,
    without_router: bool,
    effect_guard: bool | None = None,
) -> Operation:
    """``Supervisor.submit_apply``: validate and preflight, then run it as an operation."""
    guard = guard_of(parts, effect_guard)
    # A restart waiting out its backoff yields to the operator, but only once the
    # request has been found valid (below): a typo must not cancel a recovery.
    if not dry_run:
        checks.refuse_if_busy(stop, ops.current, record)
    # The apply is one operation from here on: its validate and preflight phases run on
    # it, timed as they run, and count in its duration and metrics. It becomes the
    # running operation only once they pass, so a refused request leaves nothing behind.
    base = record.levers  # what the request is merged onto
    op = Operation(kind=OpKind.APPLY, dry_run=dry_run, levers_before=base.to_json())
    requested = requested_levers(parts.schema, base, levers, env, replace=replace)
    # LeverError when SGLang (or a host check) refuses: nothing is touched.
    checked, resolved, not_run = await checks.before_the_stop(parts, record, requested, op)
    op.levers_requested = checked.to_json()
    op.not_run = not_run
    op.resolved = resolved
    unchanged = not force_restart and checks.serving_unchanged(record, checked)
    path = None
    if not unchanged:
        # Live, new weights, or a restart (LeverError: a checkpoint no load could read).
        path = await choose_path(parts, record, checked, op, force_restart=force_restart)
    # A change that leaves the router (a restart, a weights update, a storage backend
    # attached while idle) needs it to take the server back; a live knob does not.
    in_place = path is not None and path.kind == "live" and not _quiesces(path)
    if path is not None and not in_place and not without_router:
        await checks.router_answers(parts, record)  # LeverError
    drain = min(max(0.0, drain_timeout_s), parts.settings.timeouts.max_drain_s)
    if path is not None and path.kind == "restart":
        # What it will cost, stated before anything stops (the answer, the page, the CLI).
        # A change in place (live, weights) restarts nothing: ``path_reason`` says so.
        op.expected_downtime = await downtime.expected_for(parts, record, checked, drain)
    if dry_run:
        ops.keep(op)
    else:
        if not replace:
            refuse_if_superseded(ops, record, base)
        preempt_backoff(ops, record)
        # Busy if another started meanwhile (or the daemon began closing).
        ops.adopt(op, closing=stop.requested)
    if dry_run:
        diff = record.levers.diff(checked)
        op.levers_effective = record.levers.to_json()
        op.finish(SUCCEEDED)
        op.phases[-1].detail += f"; would change {', '.join(diff) or 'nothing'}"
        if unchanged:
            op.phases[-1].detail += " (the server would not be restarted)"
        elif path is not None:
            op.phases[-1].detail += f"; {path.kind}: {path.reason}"
        return op
    if unchanged:
        ops.run(op, transaction.keep_serving(record, op))
        return op
    assert path is not None
    if path.kind == "live":
        apply_live = live_change.apply_live(parts, record, stop, op, checked, path, drain, guard)
        ops.run(op, apply_live)
    elif path.kind == "weights":
        apply_weights = weights_change.apply_weights(parts, record, stop, op, checked, drain, guard)
        ops.run(op, apply_weights)
    else:
        apply = transaction.apply(
            parts, record, stop, op, checked, drain, without_router=without_router, guard=guard
        )
        ops.run(op, apply)
    return op


def _quiesces(path: ChangePath) -> bool:
    """The live change needs no request in flight (SGLang's storage-backend attach)."""
    return any(s.mechanism == "hicache_storage" for s in path.steps)


def guard_of(parts: Parts, requested: bool | None) -> bool:
    """Whether the effect guard judges this apply: the request's ``effect_guard``, else
    ``[server] effect_guard``. ``LeverError`` (422, nothing touched) when the request
    asks for it with no effect window to judge by."""
    guard = parts.settings.server.effect_guard if requested is None else requested
    if requested and parts.settings.timeouts.effect_window_s <= 0:
        raise LeverError(
            [
                LeverProblem(
                    "effect_guard",
                    "the effect guard needs an effect window, and [timeouts] effect_window_s "
                    "is 0 on this daemon: set it (seconds) and reload, or apply without "
                    "effect_guard",
                )
            ]
        )
    return guard and parts.settings.timeouts.effect_window_s > 0


def refuse_if_superseded(ops: OperationRegistry, record: ReadRecord, base: LeverSet) -> None:
    """``Busy`` when another operation changed the levers while this request was checked
    (validation may take seconds): merged onto ``base``, it would silently undo them."""
    if record.levers.digest() == base.digest():
        return
    last = ops.last or Operation(kind=OpKind.APPLY)
    raise Busy(
        last,
        f"the levers changed while this request was checked (operation {last.id}, "
        f"{last.kind}, now serves {record.levers.digest()}); nothing was changed: send it "
        "again to apply it onto the levers serving now",
    )
