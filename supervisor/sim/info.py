"""What the simulated server says about its model: ``/model_info`` (and the deprecated
``/get_model_info``) and ``/v1/models``, in SGLang 0.5.23's shapes."""

from __future__ import annotations

import time
from typing import Any

from sglang_supervisor.sim.flags import ServerConfig


def model_info(cfg: ServerConfig) -> dict[str, Any]:
    return {
        "model_path": cfg.model_path,
        "served_model_name": cfg.served_model_name,
        "tokenizer_path": cfg.args.get("tokenizer_path") or cfg.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
    }


def models(cfg: ServerConfig) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": cfg.served_model_name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "sglang",
                "root": cfg.model_path,
                "max_model_len": cfg.context_length,
            }
        ],
    }
