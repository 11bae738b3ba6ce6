"""KV-cache capacity of the simulated server, through the planner's math.

The simulated server "serves" one model and sizes its KV pool with
``supervisor.planner`` — the same functions ``POST /plan`` uses — so a plan's predicted
``max_total_num_tokens`` is exactly what the simulation reports. The model is, in order:

1. ``--model-path`` when it is a local directory with a ``config.json`` (weights from its
   ``model.safetensors.index.json`` / ``*.safetensors`` sizes, else estimated), as real
   SGLang would load it;
2. ``SGLANG_SIM_MODEL_CONFIG=<path to a config.json>`` (weights estimated from it);
3. the built-in Llama-3.1-70B-like model (80 layers, 8 KV heads of 128, 70.6e9 bf16
   parameters).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from supervisor import planner
from supervisor.planner import ModelSpec, PlanError

MODEL_CONFIG_ENV = "SGLANG_SIM_MODEL_CONFIG"

#: The built-in simulated model: Llama-3.1-70B's public config.json values.
SIM_MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
#: Its weights: 70.6e9 parameters × 2 bytes (bf16).
SIM_MODEL_WEIGHT_BYTES = 141_200_000_000

SIM_MODEL: ModelSpec = planner.model_from_config(
    SIM_MODEL_CONFIG,
    name="simulated Llama-3.1-70B",
    source="the simulated server's built-in model",
    weight_bytes=SIM_MODEL_WEIGHT_BYTES,
    weight_source="the simulated model: 70.6e9 bf16 parameters",
)


def resolve_model(model_path: str, env: Mapping[str, str]) -> ModelSpec:
    """The model the simulated server serves (see the module docstring for the order).

    Raises ``PlanError`` when ``SGLANG_SIM_MODEL_CONFIG`` or the model directory's
    config.json cannot be read or is not a transformer config.
    """
    path = Path(model_path).expanduser()
    if (path / "config.json").is_file():
        return planner.load_model_dir(path)
    configured = env.get(MODEL_CONFIG_ENV, "").strip()
    if configured:
        config_path = Path(configured).expanduser()
        config = planner.read_config(config_path)
        try:
            return planner.model_from_config(
                config, name=config_path.parent.name or model_path, source=str(config_path)
            )
        except PlanError as exc:
            raise PlanError(f"{MODEL_CONFIG_ENV}={configured}: {exc}") from exc
    return SIM_MODEL


def kv_bits(kv_cache_dtype: str | None) -> int:
    """Bits per KV element: 16 for auto/bf16, 8 for fp8 and mxfp8, 4 for the fp4 recipes."""
    return planner.kv_element_bits(kv_cache_dtype)


def cell_bytes(model: ModelSpec, tp_size: int, kv_cache_dtype: str | None, pp_size: int = 1) -> int:
    """KV bytes one token takes on one rank (``supervisor.planner.cell_bytes``)."""
    return planner.cell_bytes(model.shape, tp_size, kv_cache_dtype, pp_size)


def weight_bytes_per_rank(model: ModelSpec, tp_size: int, pp_size: int = 1) -> int:
    """The model's weights split evenly over ``tp_size × pp_size`` ranks."""
    return planner.weight_bytes_per_rank(model, tp_size, pp_size)


def kv_tokens(
    total_bytes: int, mem_fraction: float, weight_bytes_per_rank: int, cell_bytes: int
) -> int:
    """``(mem_fraction × total − weights) // cell``, floored at 0 (``planner.kv_tokens``)."""
    return planner.kv_tokens(total_bytes, mem_fraction, weight_bytes_per_rank, cell_bytes)
