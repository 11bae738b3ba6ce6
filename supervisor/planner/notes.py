"""The plan's honest notes: trade-offs, what a lever does not do, SGLang's own limits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sglang_supervisor.planner.capacity import Capacity, Hardware
from sglang_supervisor.planner.inputs import lever_bool, parse_count, speculative
from sglang_supervisor.planner.model import GB, GiB, MiB, ModelSpec


def fraction_over_rule(now: Capacity) -> float:
    """How far the operator's ``mem_fraction_static`` is above SGLang's own rule (≤ 0:
    not above, or not set)."""
    if now.mem_fraction_source != "lever":
        return 0.0
    return round(now.mem_fraction_static - now.sglang_default_fraction, 3)


def honest_notes(
    model: ModelSpec,
    hardware: Hardware,
    current: Mapping[str, Any],
    new: Mapping[str, Any],
    now: Capacity,
    after: Capacity,
    *,
    dp_after: Capacity | None,
    budget: int,
    target_concurrency: int | None,
    refused: list[str],
    host_cache_wanted: bool = True,
) -> list[str]:
    shape = model.shape
    gpu = hardware.gpu_memory_bytes
    out: list[str] = []
    over = fraction_over_rule(now)
    if over > 0:
        out.append(
            f"mem_fraction_static {now.mem_fraction_static:g} is {over:.3f} above SGLang's "
            f"own rule for these levers ({now.sglang_default_fraction:.3f}): ≈"
            f"{over * gpu / GiB:.1f} GiB of its activation and CUDA-graph reserve go to the "
            "static pool, so the server can fail at CUDA-graph capture or run out of memory "
            "on a large prefill. It may still work on your traffic; apply it anyway if you "
            "have measured it."
        )
    if abs(now.sglang_default_fraction - now.planner_rule_fraction) > 0.0005:
        out.append(
            f"SGLang's own resolution picks mem_fraction_static "
            f"{now.sglang_default_fraction:.3f} for the current levers; the planner's copy of "
            f"its rule says {now.planner_rule_fraction:.3f}. SGLang's answer is used."
        )
    for why in refused:
        out.append(f"SGLang refuses a candidate lever set, left out: {why}")
    if after.attn_dp_size > 1 and now.attn_dp_size == 1:
        out.append(
            f"Attention DP {after.attn_dp_size}: each GPU schedules its own requests and keeps "
            "its own latent KV (MLA stores the same latent on every TP rank otherwise), so "
            f"{after.kv_pools}× the requests fit. The cost: the attention weights are "
            f"replicated ({model.attention_weight_bytes / GB:.1f} GB in all, "
            f"{after.weight_bytes_per_rank / GB:.1f} GB per GPU now), SGLang reserves more "
            "for DP-attention padding (its default fraction drops to "
            f"{after.sglang_default_fraction:.3f}), chunked prefill is split per worker "
            f"({after.chunked_prefill_size:,} tokens), scheduling is less conservative "
            f"(×0.3), and a single request's latency does not improve; uneven load across "
            "workers leaves some idle."
        )
    elif dp_after is not None and after.attn_dp_size == 1:
        out.append(
            f"Attention DP {dp_after.attn_dp_size} was considered: it would give "
            f"{dp_after.concurrent_requests:,} concurrent requests against "
            f"{after.concurrent_requests:,} without it, so it is not proposed."
        )
    algo = (shape.kv_cache_quant_algo or "").upper()
    if algo == "FP8" and str(current.get("kv_cache_dtype") or "auto") == "auto":
        out.append(
            "The checkpoint's kv_cache_quant_algo is FP8: kv_cache_dtype=auto already stores "
            f"fp8 ({now.cell_bytes:,} bytes per token per rank); an fp8 kv_cache_dtype lever "
            "would change nothing."
        )
    if after.swa_tokens_per_rank:
        out.append(
            f"Sliding-window layers: the full pool holds {after.kv_tokens_per_rank:,} tokens "
            f"({after.full_cell_bytes:,} B each) and the sliding-window pool "
            f"{after.swa_tokens_per_rank:,} ({after.swa_cell_bytes:,} B each, "
            "swa_full_tokens_ratio × the full pool)."
        )
    if after.mamba_slots_per_rank:
        out.append(
            f"Linear-attention (Mamba/GDN) state: {after.mamba_slots_per_rank:,} slots of "
            f"{after.mamba_state_bytes / MiB:.1f} MiB per worker, beside a full-attention KV "
            f"pool of {after.kv_tokens_per_rank:,} tokens; the slots cap running requests at "
            f"{after.mamba_request_cap:,} per worker (3 slots each with the radix cache)."
        )
    if speculative(new) and "max_running_requests" not in current:
        out.append(
            "Speculative decoding: SGLang sets max_running_requests to 48 when it is unset, "
            "and the draft layers widen each token's KV."
        )
    if model.mtp_weight_bytes and not speculative(new):
        out.append(
            f"The checkpoint's multi-token-prediction layers ({model.mtp_weight_bytes / GB:.1f} "
            "GB) are loaded only with speculative decoding: not counted in the weights."
        )
    out.append(
        "The hierarchical cache raises prefix reuse (the cache hit rate): evicted prefixes "
        "are kept in host RAM and loaded back instead of recomputed. It does not raise the "
        "number of requests decoding at once — running requests' KV lives on the GPU."
    )
    if lever_bool(new, "disable_radix_cache") or lever_bool(new, "enable_lmcache"):
        out.append(
            "No hierarchical cache is proposed: SGLang refuses it with disable_radix_cache "
            "or enable_lmcache."
        )
    if (
        str(new.get("kv_cache_dtype")) != str(current.get("kv_cache_dtype"))
        and "kv_cache_dtype" in new
    ):
        out.append(
            f"fp8 KV cache ({new['kv_cache_dtype']}) may cost accuracy: K and V are stored in 8 "
            "bits (with scale 1.0 unless the checkpoint ships KV scales); long-context and "
            "reasoning tasks are the most sensitive. Check your evals; kv_cache_dtype=auto "
            "undoes it."
        )
    if model.weight_source.startswith("estimated"):
        out.append(
            "Weights are estimated from config.json (±10%): give a model directory with its "
            "safetensors (or model.safetensors.index.json) for exact sizes."
        )
    out.append(
        "KV tokens are estimated as (mem_fraction_static × GPU memory − weights) / bytes per "
        "token; real SGLang also loses the CUDA context and NCCL buffers (about 1–3 GiB per "
        "GPU), so its logged #tokens will be a few percent lower."
    )
    if after.host_ram_needed_bytes:
        where = f" on each of the {after.nnodes} nodes" if after.nnodes > 1 else ""
        out.append(
            f"The host pool pins {after.host_ram_needed_bytes_per_node / GiB:.0f} GiB of host "
            f"RAM{where}: "
            "every stop unpins it and every start pins it again (≈0.2 and ≈0.58 s per GiB, "
            "measured on an H200 host: the expected downtime counts both), and the "
            "supervisor's release deadline grows with it."
        )
    if (
        host_cache_wanted
        and not after.hierarchical_cache
        and not lever_bool(new, "disable_radix_cache")
    ):
        out.append(
            f"No hierarchical cache: {hardware.host_ram_available_bytes / GiB:,.0f} GiB of "
            f"available host RAM leaves {budget / GB:,.0f} GB per rank after SGLang's 10 GiB "
            f"margin and OS headroom, which does not exceed the device pool "
            f"({after.kv_bytes_per_rank / GB:,.0f} GB per rank); a host pool pays off only "
            "when it is larger."
        )
    if after.replicas > 1:
        out.append(
            f"dp_size={after.replicas}: each of the {after.replicas} replicas has its own pool; "
            "concurrent requests are summed over replicas."
        )
    if after.kv_tokens_per_rank < after.avg_tokens:
        out.append(
            f"One request of {after.avg_tokens} tokens does not fit the KV pool "
            f"({after.kv_tokens_per_rank} tokens): raise tp_size (more GPUs) or shorten requests."
        )
    if target_concurrency and after.concurrent_requests < target_concurrency:
        need = target_concurrency * after.avg_tokens // max(1, after.kv_pools)
        out.append(
            f"The target of {target_concurrency} concurrent requests needs {need} KV tokens "
            f"per pool at {after.avg_tokens} tokens each; the proposal holds "
            f"{after.kv_tokens_per_rank}. Beyond this, only more GPUs (a larger tp_size or "
            "more replicas) or shorter requests help."
        )
    cap = parse_count(new.get("max_total_tokens"))
    if cap is not None:
        out.append(f"max_total_tokens={cap} caps the pool; remove it to use the full capacity.")
    return out
