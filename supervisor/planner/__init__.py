"""KV-cache capacity math and lever recommendations for SGLang 0.5.23.

Pure functions of a model shape, a lever set and the hardware: no I/O, no processes.
May import: the shared vocabulary (top level) and ``sglang.layout``. Used by ``host``
(preflight), ``sim`` and the API's ``/plan``.
"""

from __future__ import annotations

from sglang_supervisor.planner.capacity import Capacity, Hardware, LiveLoad, capacity
from sglang_supervisor.planner.cells import (
    Cells,
    cell_bytes,
    cells,
    effective_kv_dtype,
    is_fp8,
    kv_element_bits,
)
from sglang_supervisor.planner.checkpoint import (
    estimate_params,
    estimate_weight_bytes,
    load_model_dir,
    model_from_config,
    read_config,
    weight_bytes_from_dir,
)
from sglang_supervisor.planner.downtime import ChangeFacts, Downtime, ServerFacts
from sglang_supervisor.planner.hicache import (
    DEFAULT_HICACHE_RATIO,
    SGLANG_HOST_RAM_MARGIN,
    host_pool_bytes_per_rank,
    host_pool_tokens,
)
from sglang_supervisor.planner.hostplan import host_cache_budget_per_rank
from sglang_supervisor.planner.inputs import (
    lever_bool,
    lever_float,
    lever_int,
    parallel_sizes,
    parse_count,
)
from sglang_supervisor.planner.memory import (
    MIN_ACTIVATION_TOKENS,
    Reserve,
    decode_graph_sizes,
    decode_max_bs,
    effective_fraction,
    prefill_graph_sizes,
    round_up_graph_bs,
    sglang_default_chunked_prefill,
    sglang_default_decode_max_bs,
    sglang_default_fraction,
    sglang_reserve,
)
from sglang_supervisor.planner.model import GB, GiB, MiB, ModelShape, ModelSpec, PlanError
from sglang_supervisor.planner.pools import (
    Pools,
    kv_tokens,
    loaded_weight_bytes_per_rank,
    pool_tokens,
    pools,
    weight_bytes_per_rank,
)
from sglang_supervisor.planner.proposal import (
    MAX_PROPOSED_GRAPH_BS,
    PROPOSED_FP8_DTYPE,
    Resolver,
    Validator,
    propose,
)
from sglang_supervisor.planner.report import LeverNote, Plan

#: The average request length assumed when neither the caller nor the live server says.
DEFAULT_AVG_TOKENS = 4096

__all__ = [
    "DEFAULT_AVG_TOKENS",
    "DEFAULT_HICACHE_RATIO",
    "GB",
    "MAX_PROPOSED_GRAPH_BS",
    "MIN_ACTIVATION_TOKENS",
    "PROPOSED_FP8_DTYPE",
    "SGLANG_HOST_RAM_MARGIN",
    "Capacity",
    "Cells",
    "ChangeFacts",
    "Downtime",
    "GiB",
    "Hardware",
    "LeverNote",
    "LiveLoad",
    "MiB",
    "ModelShape",
    "ModelSpec",
    "Plan",
    "PlanError",
    "Pools",
    "Reserve",
    "Resolver",
    "ServerFacts",
    "Validator",
    "capacity",
    "cell_bytes",
    "cells",
    "decode_graph_sizes",
    "decode_max_bs",
    "effective_fraction",
    "effective_kv_dtype",
    "estimate_params",
    "estimate_weight_bytes",
    "host_cache_budget_per_rank",
    "host_pool_bytes_per_rank",
    "host_pool_tokens",
    "is_fp8",
    "kv_element_bits",
    "kv_tokens",
    "lever_bool",
    "lever_float",
    "lever_int",
    "load_model_dir",
    "loaded_weight_bytes_per_rank",
    "model_from_config",
    "parallel_sizes",
    "parse_count",
    "pool_tokens",
    "pools",
    "prefill_graph_sizes",
    "propose",
    "read_config",
    "round_up_graph_bs",
    "sglang_default_chunked_prefill",
    "sglang_default_decode_max_bs",
    "sglang_default_fraction",
    "sglang_reserve",
    "weight_bytes_from_dir",
    "weight_bytes_per_rank",
]
