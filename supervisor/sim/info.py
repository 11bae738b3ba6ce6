"""What the simulated server says about itself and its model: ``/server_info``,
``/model_info`` (and the deprecated ``/get_model_info``) and ``/v1/models``, in SGLang
0.5.23's shapes."""

from __future__ import annotations

import time
from typing import Any

from sglang_supervisor.sglang.schema import BUNDLED_VERSION
from sglang_supervisor.sim.capacity import Resolved
from sglang_supervisor.sim.flags import ServerConfig
from sglang_supervisor.sim.load import Engine
from sglang_supervisor.sim.runtime import Runtime


def server_info(
    cfg: ServerConfig, resolved: Resolved, engine: Engine, runtime: Runtime
) -> dict[str, Any]:
    """``/server_info``: the launch flags, what SGLang resolved from them, and one internal
    state per DP worker (its pool, its share of the requests, ``set_internal_state``'s
    overrides)."""
    answer = dict(cfg.args)
    answer.update(resolved.server_info())
    answer.update(
        mem_fraction_static=resolved.mem_fraction_static,
        max_total_num_tokens=resolved.max_total_num_tokens,
        max_running_requests=max(1, resolved.max_running_requests),
        version=BUNDLED_VERSION,
        simulated=True,
        internal_states=[
            {
                "max_total_num_tokens": resolved.max_total_num_tokens,
                "max_running_requests": engine.max_running,
                **runtime.internal_state(),
            }
            for _ in engine.workers
        ],
    )
    return answer


def model_info(cfg: ServerConfig, runtime: Runtime) -> dict[str, Any]:
    """``/model_info``: a weights update moves ``model_path`` and ``served_model_name``
    (tokenizer_manager.py ``_update_model_path_info``) and sets ``weight_version``; the
    tokenizer stays the launch's."""
    return {
        "model_path": runtime.model_path,
        "served_model_name": runtime.served_model_name,
        "tokenizer_path": cfg.args.get("tokenizer_path") or cfg.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": runtime.weight_version,
        "load_format": runtime.load_format,
    }


def models(cfg: ServerConfig, runtime: Runtime) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": runtime.served_model_name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "sglang",
                "root": runtime.model_path,
                "max_model_len": cfg.context_length,
            }
        ],
    }
