"""An apply that changes only what ``/update_weights_from_disk`` takes (``model_path``, and
``load_format``/``weight_version``), to a checkpoint of the same model (checked by
``engine.paths`` before anything is touched): new weights without a reload.

journal -> warm the page cache, out of the router, drain (as before a stop) -> weights
(SGLang waits for the requests in flight, holds new ones, loads in place) -> verify
(``/model_info`` names the new path and the ``weight_version`` sent; ``/health_generate``
answers) -> back in the router -> commit. The pid never changes.

SGLang loads in place, and its own recovery from a failed load reloads from the path it
was given (``model_runner_components/weight_updater.py``: ``model_config.model_path`` is
set first), so a failed update may leave the new, broken weights: the daemon updates back
to the old checkpoint explicitly (``rollback_weights``), confirmed the same way, and when
that fails too restarts the last-good levers. It never reports weights it has not
confirmed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sglang_supervisor.engine.boundaries import Cancelled, checkpoint
from sglang_supervisor.engine.live_calls import LiveFailed, LiveServer
from sglang_supervisor.engine.live_change import back_in_service, commit_in_place
from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ServerRecord
from sglang_supervisor.engine.rollback import no_cancel_from_here, roll_back
from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.engine.transaction import drain_or_cancel
from sglang_supervisor.operations import FAILED, ROLLED_BACK, SUCCEEDED, Operation
from sglang_supervisor.phases import PhaseName, PhasePrefix, prefixed
from sglang_supervisor.sglang.control import ControlError
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.states import ServerState

S = ServerState


def weight_version(levers: LeverSet) -> str:
    """The ``weight_version`` an update to ``levers`` sends: the lever when the set has
    one, else a tag naming the checkpoint and the set (so ``/model_info`` tells them apart)."""
    given = levers.levers.get("weight_version")
    if given:
        return str(given)
    return f"{Path(str(levers.levers.get('model_path') or '')).name}@{levers.digest()}"


async def apply_weights(
    parts: Parts,
    record: ServerRecord,
    stop: StopRequest,
    op: Operation,
    new: LeverSet,
    drain_s: float,
    guard: bool = False,
) -> None:
    """Load ``new``'s checkpoint into the ready server, confirm it, commit ``new``. With
    ``guard`` the commit waits for the measured effect (``engine.effect``): a worse one
    loads the old weights back; without it the effect is measured after the commit."""
    server = record.server
    assert server is not None
    old, handle = server.levers, server.handle
    await parts.journal.begin_apply(op.id, new, path="weights")
    exiting = False
    try:
        if not await drain_or_cancel(parts, record, stop, op, drain_s, new):
            return
        live = LiveServer(parts, handle, old)
        try:
            before = await live.read("/model_info")
        except (LiveFailed, ControlError) as exc:
            # Nothing was loaded yet: the old weights serve.
            why = f"/model_info could not be read before the update: {exc}"
            await back_in_service(parts, record, op, quiet=True)
            op.rollback_reason = why
            op.levers_effective = record.levers.to_json()
            op.finish(ROLLED_BACK, f"{why}; nothing was loaded")
            return
        target = _target(new)
        ph = op.phase(PhaseName.WEIGHTS)
        try:
            checkpoint(stop, op)
            said = await _update(live, target)
            ph.end(SUCCEEDED, f"{said} (pid {handle.pid})")
            ph = op.phase(PhaseName.VERIFY)
            ph.end(SUCCEEDED, await _confirm(live, target))
            checkpoint(stop, op)  # a cancel during the load: its weights go back
        except (LiveFailed, ControlError, Cancelled) as exc:
            if isinstance(exc, Cancelled) and exc.shutdown:
                ph.end(FAILED, f"interrupted: {exc}")
                raise
            if ph.state != FAILED:
                ph.end(FAILED, str(exc))
            await update_back(parts, record, stop, op, live, old, before, str(exc))
            return
        await back_in_service(parts, record, op, quiet=True)

        async def undo(why: str) -> None:
            await update_back(parts, record, stop, op, live, old, before, why)

        said = f"new weights loaded in place: pid {handle.pid} serves on"
        await commit_in_place(parts, record, stop, op, new, guard=guard, undo=undo, said=said)
    except asyncio.CancelledError:
        exiting = True
        raise
    finally:
        if not exiting:
            await parts.journal.clear_pending()


def _target(levers: LeverSet) -> dict[str, Any]:
    lv = levers.levers
    return {
        "model_path": str(lv.get("model_path")),
        "load_format": lv.get("load_format"),
        "weight_version": weight_version(levers),
        "abort_all_requests": False,  # the requests in flight finish first
        "flush_cache": True,  # the prefix cache holds the old weights' KV
    }


async def _update(live: LiveServer, body: Mapping[str, Any]) -> str:
    ans = await live.parts.control.update_weights(
        live.url, body, keys=live.keys, timeout_s=live.load_timeout_s
    )
    if not ans.ok:
        raise LiveFailed(
            f"SGLang's update to {body['model_path']} failed (answered {ans.status}): "
            f"{' '.join(ans.detail.split())}"
        )
    return f"{body['model_path']}: {ans.detail}"


async def _confirm(live: LiveServer, body: Mapping[str, Any]) -> str:
    """``/model_info`` names the path and version sent, and a generation runs."""
    info = await live.read("/model_info")
    path, version = info.get("model_path"), info.get("weight_version")
    if path != body["model_path"] or version != body["weight_version"]:
        raise LiveFailed(
            f"/model_info reads model_path {path!r}, weight_version {version!r}; expected "
            f"{body['model_path']!r}, {body['weight_version']!r}"
        )
    t = live.parts.settings.timeouts
    probe = await live.parts.health.generate_ok(live.url, t.liveness_timeout_s)
    if not probe.ok:
        raise LiveFailed(f"the new weights do not generate: {probe.detail}")
    return f"/model_info: model_path {path}, weight_version {version}; /health_generate 200"


async def update_back(
    parts: Parts,
    record: ServerRecord,
    stop: StopRequest,
    op: Operation,
    live: LiveServer,
    old: LeverSet,
    before: Mapping[str, Any],
    reason: str,
) -> None:
    """The update failed or was cancelled: load the old checkpoint back explicitly and
    confirm it; failing that, restart the last-good levers."""
    no_cancel_from_here(op, "loading the old weights back")
    ph = op.phase(prefixed(PhasePrefix.ROLLBACK, PhaseName.WEIGHTS))
    body = {
        **_target(old),
        "model_path": str(before.get("model_path") or old.levers.get("model_path")),
        "weight_version": str(before.get("weight_version") or weight_version(old)),
    }
    try:
        said = await _update(live, body)
        said += f"; {await _confirm(live, body)}"
    except (LiveFailed, ControlError) as exc:
        ph.end(FAILED, f"{exc}; restarting the last-good levers")
        await roll_back(
            parts, record, stop, op, f"{reason}; loading the old weights back failed: {exc}"
        )
        return
    ph.end(SUCCEEDED, said)
    await back_in_service(parts, record, op, quiet=True)
    op.rollback_reason = reason
    op.levers_effective = record.levers.to_json()
    op.finish(
        ROLLED_BACK,
        f"{reason}; the old weights ({body['model_path']}, weight_version "
        f"{body['weight_version']}) were loaded back: pid {live.handle.pid} serves on",
    )
