"""What the simulated server says about its model: ``/model_info`` (and the deprecated
``/get_model_info``) and ``/v1/models``, in SGLang 0.5.23's shapes."""

from __future__ import annotations

import time
from typing import Any

from sglang_supervisor.sim.flags import ServerConfig
from sglang_supervisor.sim.runtime import Runtime


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
