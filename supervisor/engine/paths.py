"""Which way an apply reaches the server (``operation.path``, ``path_reason``): live
(levers SGLang changes on the running server), weights (a new checkpoint of the same model
loaded into it) or a restart, and why — decided before anything is touched.

``sglang_supervisor.sglang.live.choose`` reads the levers; a weights update also needs
both checkpoints on this host, the same model (config, every tensor's dtype and shape),
the same tokenizer, and nothing SGLang's update would do differently from a restart
(the served model's name, a draft model, the weight cache, several nodes). A new
checkpoint that a restart could not load either (a shard missing or cut short) is
refused (422): nothing was touched.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ReadRecord
from sglang_supervisor.host import checkpoint_files as ckpt
from sglang_supervisor.operations import Operation
from sglang_supervisor.sglang.levers import LeverError, LeverProblem, LeverSet
from sglang_supervisor.sglang.live import ChangePath, LiveSet, choose, restart
from sglang_supervisor.states import ServerState

S = ServerState


async def choose_path(
    parts: Parts, record: ReadRecord, new: LeverSet, op: Operation, *, force_restart: bool
) -> ChangePath:
    """The way from the serving set to ``new`` (which differs from it), recorded on ``op``
    (``path``, ``path_reason``). Raises ``LeverError`` for a new checkpoint that no load
    could read."""
    server = record.server
    if force_restart:
        path = restart("force_restart: the server is restarted whatever changed")
    elif record.state != S.READY or server is None or server.handle.poll():
        path = restart(f"the server is {record.state}, not serving: it is started anew")
    else:
        path = choose(server.levers, new, LiveSet.of(parts.schema), parts.schema)
        if path.kind == "weights":
            try:
                why = await asyncio.to_thread(weights_problem, parts, server.levers, new)
            except ckpt.CheckpointError as exc:
                raise LeverError(
                    [
                        LeverProblem(
                            "model_path",
                            f"{exc}: no load could read it (an update nor a restart); "
                            "nothing was touched",
                        )
                    ]
                ) from exc
            if why is not None:
                path = restart(f"only model_path changed, but {why}; a restart loads it")
    op.path, op.path_reason = path.kind, path.reason
    return path


def weights_problem(parts: Parts, serving: LeverSet, new: LeverSet) -> str | None:
    """Why ``/update_weights_from_disk`` would not serve what a restart with ``new`` would
    (None: it would). Raises ``CheckpointError`` when the new checkpoint is broken.
    Blocking: reads both checkpoints' headers."""
    old_lv, lv = serving.levers, new.levers
    cwd = parts.settings.server.cwd
    if int(_num(lv.get("nnodes"), 1)) > 1:
        return "the server spans nodes: this host cannot check every node's files"
    if lv.get("speculative_algorithm"):
        # scheduler_components/weight_updater.py: the draft runner loads the same path.
        return "SGLang's update would load the new model_path into the draft model too"
    if str(lv.get("weight_cache_mode") or "off") != "off":
        return "SGLang refuses an update while the weight cache is on (weight_cache_mode)"
    if str(lv.get("load_format") or "auto") not in ("auto", "safetensors"):
        return "only SGLang's default loader updates weights in place (load_format)"
    new_path = str(lv.get("model_path") or "")
    served = lv.get("served_model_name")
    if served and served != new_path:
        # tokenizer_manager.py _update_model_path_info: served_model_name = model_path.
        return (
            f"SGLang's update renames the served model to the new model_path, while "
            f"served_model_name is {served!r}"
        )
    old_dir = ckpt.local_dir(str(old_lv.get("model_path") or ""), cwd)
    new_dir = ckpt.local_dir(new_path, cwd)
    if old_dir is None or new_dir is None:
        which = old_lv.get("model_path") if old_dir is None else new_path
        return f"{which} is not a directory on this host: its files cannot be checked first"
    new_ck = ckpt.read_checkpoint(new_dir)  # broken: CheckpointError (refused)
    try:
        old_ck = ckpt.read_checkpoint(old_dir)
    except ckpt.CheckpointError as exc:
        return (
            f"the serving checkpoint cannot be read back ({exc}): a failed update could "
            "not be undone"
        )
    differs = ckpt.same_model(old_ck, new_ck)
    if differs is not None:
        return f"the new checkpoint is not the same model: {differs}"
    if not lv.get("tokenizer_path"):
        files = ckpt.tokenizer_differs(old_dir, new_dir)
        if files:
            return (
                f"its tokenizer differs ({', '.join(files)}) and an update keeps the "
                "launch's tokenizer"
            )
    return None


def _num(value: Any, default: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default
