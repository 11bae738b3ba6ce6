"""KV-cache capacity of the simulated server's fixed model.

The simulated server always "serves" a Llama-3.1-70B-like dense model, whatever
``--model-path`` says, so that ``max_total_num_tokens`` reacts to the levers the way real
SGLang's does (memory fraction, TP size, fp8 KV cache). The planner owns the real math;
this stays one small function plus the model's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SimModel:
    architecture: str = "LlamaForCausalLM"
    num_layers: int = 80
    num_kv_heads: int = 8
    head_dim: int = 128
    num_params: float = 70.6e9
    #: Bytes per weight element (bf16).
    weight_bytes_per_param: int = 2


SIM_MODEL = SimModel()


def kv_bits(kv_cache_dtype: str | None) -> int:
    """Bits per KV element: 16 for auto/bf16, 8 for fp8 and mxfp8, 4 for the fp4 recipes."""
    dtype = (kv_cache_dtype or "auto").lower()
    if dtype.startswith(("fp8", "mxfp8")):
        return 8
    if "fp4" in dtype:
        return 4
    return 16


def cell_bytes(model: SimModel, tp_size: int, kv_cache_dtype: str | None, pp_size: int = 1) -> int:
    """KV bytes one token takes on one rank: ``2 × layers × max(1, kv_heads // tp) × head_dim × b``.

    With pipeline parallelism each rank holds only its share of the layers.
    """
    layers = max(1, model.num_layers // max(1, pp_size))
    heads = max(1, model.num_kv_heads // max(1, tp_size))
    return 2 * layers * heads * model.head_dim * kv_bits(kv_cache_dtype) // 8


def weight_bytes_per_rank(model: SimModel, tp_size: int, pp_size: int = 1) -> int:
    """The model's weights split evenly over ``tp_size × pp_size`` ranks."""
    ranks = max(1, tp_size) * max(1, pp_size)
    return int(model.num_params * model.weight_bytes_per_param / ranks)


def kv_tokens(
    total_bytes: int, mem_fraction: float, weight_bytes_per_rank: int, cell_bytes: int
) -> int:
    """Tokens the KV pool of one rank holds, as SGLang sizes it.

    ``(mem_fraction × total − weights) / cell``: the fraction is of the GPU's *total*
    memory and the weights come out of it. Floored at 0 (the weights alone do not fit).
    """
    if cell_bytes <= 0:
        raise ValueError(f"cell_bytes must be positive, got {cell_bytes}")
    free_for_kv = mem_fraction * total_bytes - weight_bytes_per_rank
    return max(0, int(free_for_kv // cell_bytes))
