"""One rank's pools for a lever set, as SGLang 0.5.23 sizes them at start.

(Paths under ``sglang/srt/``.) The budget is ``mem_fraction_static × total − weights``
(``mem_cache/kv_cache_configurator.py:2990-3060``: free memory after loading minus
``(1 − fraction) × total``; real SGLang also loses the CUDA context and NCCL buffers,
1–3 GiB, so its logged ``#tokens`` is a few percent lower), less the multimodal cache of
a multimodal model (``SGLANG_VLM_CACHE_SIZE_MB``, 100 MiB: ``planner.multimodal``). From it:

* linear-attention hybrids first take the state pool: ``mamba_full_memory_ratio``
  (0.9) / (1 + ratio) of the budget in slots of one request's state
  (``kv_cache_configurator.py:3229-3408``);
* the full pool gets ``rest // cell`` tokens, the sliding-window pool
  ``swa_full_tokens_ratio`` × that (``model_executor/pool_configurator.py:859-918``);
* ``max_running_requests`` per DP worker: the lever (or 48 with speculative decoding)
  // attn_dp, else ``clamp(tokens / context_len × 512, 2048, 4096)``, at most tokens / 2,
  and at most the state slots / 5 in Mamba hybrids at SGLang's defaults (the
  ``extra_buffer`` strategy; / 3 with ``no_buffer``, / 1 without the radix cache;
  ``kv_cache_configurator.py:3062-3088``, ``:3119-3173``);
* every pool is a whole number of pages (``pool_configurator.py:641-646``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sglang_supervisor.planner.cells import Cells, cells
from sglang_supervisor.planner.inputs import (
    lever_bool,
    lever_float,
    lever_int,
    parse_count,
    requested_max_running,
    speculative,
)
from sglang_supervisor.planner.memory import effective_fraction, sglang_default_chunked_prefill
from sglang_supervisor.planner.model import MiB, ModelSpec
from sglang_supervisor.sglang.layout import Layout

#: SGLang's default ``mamba_full_memory_ratio`` (``arg_groups/fields/schedule.py:220-227``).
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9
#: State slots per running request with the radix cache (``kv_cache_configurator.py:227``).
MAMBA_SLOTS_PER_REQUEST = 3
#: Architectures whose radix cache SGLang resolves ``mamba_radix_cache_strategy=auto``
#: for (``arg_groups/overrides.py:369-380``, ``:476-486``).
MAMBA_RADIX_CACHE_ARCHS = frozenset(
    {
        "KimiLinearForCausalLM",
        "BailingMoeV2_5ForCausalLM",
        "Qwen3NextForCausalLM",
        "Qwen3_5MoeForConditionalGeneration",
    }
)


def mamba_strategy(architecture: str, levers: Mapping[str, Any]) -> str:
    """``mamba_radix_cache_strategy`` as SGLang 0.5.23 resolves it: ``auto`` becomes
    ``extra_buffer`` with the overlap schedule (its default) or pages over 1, else
    ``no_buffer`` (``arg_groups/overrides.py:476-486``); nothing without the radix cache."""
    if lever_bool(levers, "disable_radix_cache"):
        return "none"
    strategy = str(levers.get("mamba_radix_cache_strategy") or "auto")
    if strategy != "auto" or architecture not in MAMBA_RADIX_CACHE_ARCHS:
        return strategy if strategy != "auto" else "no_buffer"
    overlap = not lever_bool(levers, "disable_overlap_schedule")
    paged = (lever_int(levers, "page_size") or 1) > 1
    return "extra_buffer" if overlap or paged else "no_buffer"


def mamba_slots_per_request(architecture: str, levers: Mapping[str, Any]) -> int:
    """State slots one running request takes (``_calculate_mamba_ratio``,
    ``mem_cache/kv_cache_configurator.py:3062-3088``): 1 without the radix cache, else 3
    plus the extra buffer's tracking slots — 2 with the overlap schedule, 1 without or
    lazily (``mem_cache/allocation_sizing.py:11-19``)."""
    strategy = mamba_strategy(architecture, levers)
    if strategy == "none":
        return 1
    if strategy == "extra_buffer_lazy":
        return MAMBA_SLOTS_PER_REQUEST + 1
    if strategy == "extra_buffer":
        overlap = not lever_bool(levers, "disable_overlap_schedule")
        return MAMBA_SLOTS_PER_REQUEST + (2 if overlap else 1)
    return MAMBA_SLOTS_PER_REQUEST


def weight_bytes_per_rank(model: ModelSpec, tp_size: int, pp_size: int = 1) -> int:
    """The weights split evenly over ``tp × pp`` ranks (replicated embeddings and norms
    are ignored: a slight underestimate at large TP)."""
    return int(model.weight_bytes // (max(1, tp_size) * max(1, pp_size)))


def loaded_weight_bytes_per_rank(model: ModelSpec, levers: Mapping[str, Any]) -> int:
    """Weights one rank loads: the MTP layers only with speculative decoding; with
    attention DP the attention weights are split over the attention TP group only
    (replicated across the DP groups), the rest over ``tp × pp``."""
    lay = Layout.of(levers)
    total = model.loaded_weight_bytes(speculative(levers))
    attn = min(model.attention_weight_bytes, total) if lay.attn_dp_size > 1 else 0
    rest = (total - attn) // (lay.tp_size * lay.pp_size)
    return int(rest + attn // (lay.attn_tp_size * lay.pp_size))


#: What SGLang resolves about how KV is stored, taken from its answer when the lever is
#: unset: the dtype (``auto`` is fp8 for DSA from SM100 on, ``overrides.py:490-547``) and
#: the DSA backends (which pick the fp8 latent's layout, ``planner.dsa``).
RESOLVED_STORAGE = ("kv_cache_dtype", "dsa_prefill_backend", "dsa_decode_backend")


def resolved_storage(
    levers: Mapping[str, Any], resolved: Mapping[str, Any] | None
) -> dict[str, Any]:
    """SGLang's resolved storage settings for the levers that leave them unset."""
    out: dict[str, Any] = {}
    for key in RESOLVED_STORAGE:
        value = (resolved or {}).get(key)
        unset = levers.get(key) in (None, "auto")
        if unset and isinstance(value, str) and value and value != "auto":
            out[key] = value
    return out


def page_size(model: ModelSpec, levers: Mapping[str, Any]) -> int:
    """The pool's page: the lever, else 64 × ``index_kpool`` for a DSA model (``planner.dsa``),
    else 1."""
    explicit = lever_int(levers, "page_size")
    if explicit is not None and explicit > 0:
        return explicit
    return model.shape.dsa.page_size if model.shape.dsa is not None else 1


def kv_tokens(
    total_bytes: int, mem_fraction: float, weight_bytes_per_rank: int, cell_bytes: float
) -> int:
    """Tokens one rank's KV pool holds: ``(mem_fraction × total − weights) // cell``,
    floored at 0 (the weights alone do not fit)."""
    if cell_bytes <= 0:
        raise ValueError(f"cell_bytes must be positive, got {cell_bytes}")
    free_for_kv = mem_fraction * total_bytes - weight_bytes_per_rank
    return max(0, int(free_for_kv // cell_bytes))


@dataclass(frozen=True)
class Pools:
    """One rank's (one DP worker's) pools."""

    cells: Cells
    mem_fraction_static: float
    weight_bytes_per_rank: int
    #: ``fraction × total − weights``: what the pools share.
    budget_bytes: int
    #: What is left of it for the KV pools after the state pool (SGLang's
    #: ``available_bytes`` for ``calculate_pool_sizes``, pool_configurator.py:637-646).
    kv_budget_bytes: int
    #: ``max_total_num_tokens``: the full pool (capped by ``max_total_tokens``).
    kv_tokens: int
    swa_tokens: int
    #: ``max_mamba_cache_size`` per DP worker (0 without linear attention).
    mamba_slots: int
    #: The request cap the state slots impose (None without linear attention).
    mamba_request_cap: int | None
    #: SGLang's ``max_running_requests`` per DP worker.
    max_running_requests: int
    max_running_source: str


def _mamba_slots(
    budget: float, per_slot: int, levers: Mapping[str, Any], attn_dp: int, ratio_slots: int
) -> tuple[int, float]:
    """(state slots, bytes they take) per ``_handle_max_mamba_cache``."""
    explicit = lever_int(levers, "max_mamba_cache_size")
    running = requested_max_running(levers)
    if explicit is not None and explicit > 0:
        slots = explicit // attn_dp
    elif lever_bool(levers, "disable_radix_cache") and running is not None:
        slots = max(1, running // attn_dp)
    else:
        ratio = lever_float(levers, "mamba_full_memory_ratio")
        r = DEFAULT_MAMBA_FULL_MEMORY_RATIO if ratio is None else ratio
        share = budget * r / (1 + r)
        if speculative(levers):
            d = lever_int(levers, "speculative_num_draft_tokens") or 4
            q = ratio_slots
            slots = int((share - per_slot * (1 + d)) // (per_slot * (1 + d / q)))
            capped = min(max(1, (running or 48) // attn_dp), max(0, slots) // q)
            return slots, (max(0, slots) + 1) * per_slot + per_slot * (capped + 1) * d
        slots = int((share - per_slot) // per_slot)
    return slots, (max(0, slots) + 1) * per_slot


def _swa_request_cap(
    window: int | None, levers: Mapping[str, Any], attn_dp: int, default_chunk: int
) -> int | None:
    """SWA slots for the worst case at an explicit ``max_running_requests`` without the
    radix cache (``compute_swa_request_cap``, pool_configurator.py:924-968); None when
    SGLang sizes the SWA pool by the ratio instead (``:986-1003``)."""
    running = lever_int(levers, "max_running_requests")
    chunk = lever_int(levers, "chunked_prefill_size")
    if window is None or not running or not lever_bool(levers, "disable_radix_cache"):
        return None
    if chunk is not None and chunk <= 0:
        return None
    if speculative(levers):
        return None  # the speculative decode allocation is not modelled: use the ratio
    eviction_interval, page = 128, 1
    per_request = window + eviction_interval + page + page
    chunks_in_flight = 1 if lever_bool(levers, "disable_overlap_schedule") else 2
    worker_chunk = (chunk or default_chunk) // attn_dp
    return per_request * max(1, running // attn_dp) + chunks_in_flight * worker_chunk + page


def pools(model: ModelSpec, levers: Mapping[str, Any], gpu_bytes: int) -> Pools:
    """The pools of one rank for ``levers`` on a GPU of ``gpu_bytes``."""
    shape = model.shape
    lay = Layout.of(levers)
    c = cells(shape, levers)
    fraction = effective_fraction(gpu_bytes, levers, shape)
    weights = loaded_weight_bytes_per_rank(model, levers)
    mm = shape.multimodal.cache_reserve_bytes(levers, {}) if shape.multimodal else 0
    # What the running server's own pool shows the formula counts but it does not have.
    unseen = model.served.unseen_bytes_per_rank if model.served is not None else 0
    budget = fraction * gpu_bytes - weights - mm - unseen
    rest = budget
    slots = 0
    if c.mamba_state_bytes:
        per_request = mamba_slots_per_request(shape.architecture, levers)
        slots, taken = _mamba_slots(
            budget, c.mamba_state_bytes, levers, lay.attn_dp_size, per_request
        )
        rest = budget - taken
    tokens = max(0, int(rest // c.exact)) if c.exact > 0 else 0
    swa = int(tokens * c.swa_full_tokens_ratio) if c.swa_layers else 0
    swa_cap = _swa_request_cap(
        shape.sliding_window,
        levers,
        lay.attn_dp_size,
        sglang_default_chunked_prefill(gpu_bytes / MiB),
    )
    if c.swa_layers and c.full_layers and swa_cap is not None:
        # SWARequestCapPoolConfigurator: the SWA pool sized from the request cap, the rest
        # to the full pool (pool_configurator.py:971-1032).
        swa = swa_cap
        tokens = max(0, int((rest - swa * c.swa_bytes) // c.full_bytes))
    cap = parse_count(levers.get("max_total_tokens"))
    if cap is not None:
        tokens = min(tokens, cap)
    # Whole pages only (pool_configurator.py:641-646); the SWA pool is the ratio of the
    # aligned full pool, aligned again (:879-881).
    page = page_size(model, levers)
    tokens = tokens // page * page
    if c.swa_layers and swa_cap is None:
        swa = int(tokens * c.swa_full_tokens_ratio) // page * page
    # max_running_requests (resolve_max_num_reqs).
    context = parse_count(levers.get("context_length")) or model.context_length or 4096
    requested = requested_max_running(levers)
    if requested is not None:
        running = min(max(1, requested // lay.attn_dp_size), tokens // 2)
        source = "lever" if lever_int(levers, "max_running_requests") else "speculative default 48"
    else:
        estimated = max(min(int(tokens / context * 512), 4096), 2048)
        running = min(estimated, tokens // 2)
        source = "SGLang default"
    mamba_cap = None
    if c.mamba_state_bytes:
        per_request = mamba_slots_per_request(shape.architecture, levers)
        mamba_cap = max(0, slots) // per_request
        if mamba_cap < running:
            running, source = mamba_cap, "capped by the Mamba state slots"
    return Pools(
        cells=c,
        mem_fraction_static=fraction,
        weight_bytes_per_rank=weights,
        budget_bytes=int(budget),
        kv_budget_bytes=int(rest),
        kv_tokens=tokens,
        swa_tokens=swa,
        mamba_slots=max(0, slots),
        mamba_request_cap=mamba_cap,
        max_running_requests=max(0, running),
        max_running_source=source,
    )


def pool_tokens(model: ModelSpec, levers: Mapping[str, Any], gpu_bytes: int) -> int:
    """``max_total_num_tokens`` of one rank for ``levers`` (``Pools.kv_tokens``). The
    simulated server reports exactly this."""
    return pools(model, levers, gpu_bytes).kv_tokens
