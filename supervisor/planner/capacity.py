"""The capacity of one lever set: per rank, per DP worker, over the whole server."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sglang_supervisor.planner.diagnosis import LoadKind, classify, sentence
from sglang_supervisor.planner.hicache import auto_ratio, auto_sized, host_pool_tokens
from sglang_supervisor.planner.inputs import lever_bool, lever_float, lever_int
from sglang_supervisor.planner.memory import sglang_reserve
from sglang_supervisor.planner.model import ModelSpec
from sglang_supervisor.planner.nodes import NodeShare
from sglang_supervisor.planner.pools import page_size, pools, resolved_storage
from sglang_supervisor.planner.prefixcache import PrefixEvidence
from sglang_supervisor.planner.stopcost import StopBudget
from sglang_supervisor.sglang.layout import Layout


@dataclass(frozen=True)
class Hardware:
    #: GPUs of one host: of one node when the levers span nodes (``nnodes``; planner.nodes).
    gpus: int
    gpu_memory_bytes: int
    #: Host RAM available to a new server (what SGLang's check measures).
    host_ram_available_bytes: int
    gpu_source: str = "given"
    host_ram_source: str = "given"
    #: The daemon's stop deadlines and the service's stop budget (None: not bounded).
    stop: StopBudget | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Capacity:
    """What one lever set gives, per rank and over the server."""

    mem_fraction_static: float
    #: "lever", "SGLang default" (the planner's copy of the rule), "SGLang's own
    #: resolution" (SGLang's answer, where it is installed) or "the running server" (its
    #: launch log, for the set it serves: ``planner.served``).
    mem_fraction_source: str
    safe_mem_fraction: float
    #: SGLang's own default for this lever set (rounded to 3 decimals, then × a vision
    #: tower's cut, unrounded: ``planner.multimodal``): its resolution's or the running
    #: server's answer where there is one, else the planner's copy of its rule.
    sglang_default_fraction: float
    #: The planner's copy of SGLang's rule (the fallback).
    planner_rule_fraction: float
    #: The KV dtype stored (``auto`` resolved: fp8 on an FP8-KV checkpoint).
    kv_cache_dtype: str
    #: Bytes per token of ``max_total_num_tokens`` (full + ratio × sliding window).
    cell_bytes: int
    cell_bytes_exact: float
    full_cell_bytes: int
    swa_cell_bytes: int
    weight_bytes_per_rank: int
    #: ``max_total_num_tokens`` of one rank (one DP worker): the full pool.
    kv_tokens_per_rank: int
    kv_bytes_per_rank: int
    #: The sliding-window pool (0 without sliding-window layers).
    swa_tokens_per_rank: int
    #: Mamba / linear-attention state slots per DP worker and the bytes of one.
    mamba_slots_per_rank: int
    mamba_state_bytes: int
    #: The request cap the state slots impose per DP worker (None without them).
    mamba_request_cap: int | None
    avg_tokens: int
    #: Requests whose KV fits at once at the average length, over all KV pools.
    concurrent_requests: int
    hierarchical_cache: bool
    host_pool_tokens_per_rank: int
    host_ram_needed_bytes: int
    #: SGLang's resolved ``max_running_requests`` over the server (per worker × workers).
    max_running_requests: int
    max_running_requests_per_worker: int
    max_running_requests_source: str
    cuda_graph_max_bs_decode: int | None
    #: Per DP worker (SGLang divides it by attn_dp_size).
    chunked_prefill_size: int
    schedule_conservativeness: float
    ranks: int
    replicas: int
    attn_dp_size: int
    #: Independent KV pools (request schedulers): replicas × attention-DP groups.
    kv_pools: int
    #: Where ``kv_tokens_per_rank`` comes from: "formula", "the running server's own
    #: sizing" (its max_total_num_tokens, for the set it serves) or "formula, scaled by
    #: the running server's own sizing" (``planner.served``).
    kv_tokens_source: str = "formula"
    #: The formula's figure where the server's own replaced it (None otherwise).
    formula_kv_tokens_per_rank: int | None = None
    #: Nodes the server spans and the ranks on each (``planner.nodes``; 1 and ``ranks``
    #: on one host). Host RAM is each node's own: the host pool's per node.
    nnodes: int = 1
    ranks_per_node: int = 1
    host_ram_needed_bytes_per_node: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def capacity(
    model: ModelSpec,
    levers: Mapping[str, Any],
    gpu_bytes: int,
    avg_tokens: int,
    host_ram_bytes: int | None = None,
    resolved: Mapping[str, Any] | None = None,
) -> Capacity:
    """Device and host KV capacity of ``levers`` on GPUs of ``gpu_bytes`` each
    (``host_ram_bytes``: the available host RAM, for an auto-sized host pool).

    ``resolved``: the values SGLang's own resolution picked for ``levers`` where SGLang is
    installed; its ``mem_fraction_static`` is then the default instead of the planner's
    copy of the rule.
    """
    lay = Layout.of(levers)
    share = NodeShare.of(levers)
    reserve = sglang_reserve(gpu_bytes, levers, model.shape)
    explicit = lever_float(levers, "mem_fraction_static")
    source = "lever" if explicit is not None else "SGLang default"
    sized = levers
    sglang_fraction = (resolved or {}).get("mem_fraction_static")
    if explicit is None and isinstance(sglang_fraction, (int, float)) and sglang_fraction > 0:
        sized = {**levers, "mem_fraction_static": float(sglang_fraction)}
        source = "SGLang's own resolution"
    served = model.served
    if served is not None and served.serves(levers) and explicit is None:
        # The running server's own fraction (its launch log) wins over any rule's.
        sized = {**levers, "mem_fraction_static": served.sized_fraction}
        source = "the running server" if served.mem_fraction_static is not None else source
    page = (resolved or {}).get("page_size")
    if lever_int(levers, "page_size") is None and isinstance(page, int) and page > 1:
        sized = {**sized, "page_size": page}  # SGLang's resolved page (its backend's)
    sized = {**sized, **resolved_storage(levers, resolved)}
    p = pools(model, sized, gpu_bytes)
    c = p.cells
    tokens = p.kv_tokens
    device_bytes = (
        tokens * c.full_bytes
        + p.swa_tokens * c.swa_bytes
        + (p.mamba_slots + 1 if c.mamba_state_bytes else 0) * c.mamba_state_bytes
    )
    hicache = lever_bool(levers, "enable_hierarchical_cache")
    host_tokens = 0
    if hicache:
        ratio = lever_float(levers, "hicache_ratio")
        if auto_sized(levers) and host_ram_bytes is not None:
            ratio = max(0.0, auto_ratio(device_bytes, host_ram_bytes, share.ranks_per_node))
        host_tokens = host_pool_tokens(
            lever_int(levers, "hicache_size") or 0,
            ratio,
            tokens,
            c.exact,
            page_size(model, sized),
        )
    per_worker_fit = tokens // max(1, avg_tokens)
    if p.mamba_request_cap is not None:
        per_worker_fit = min(per_worker_fit, p.mamba_request_cap)
    conservativeness = lever_float(levers, "schedule_conservativeness") or 1.0
    if lay.attn_dp_size > 1:
        conservativeness *= 0.3  # parallel_hook.py:314-319
    chunk = reserve.chunked_prefill_size
    if lay.attn_dp_size > 1 and chunk > 0:
        chunk //= lay.attn_dp_size  # parallel_hook.py:327-332
    return Capacity(
        mem_fraction_static=p.mem_fraction_static,
        mem_fraction_source=source,
        safe_mem_fraction=reserve.safe_fraction,
        sglang_default_fraction=p.mem_fraction_static
        if source in ("SGLang's own resolution", "the running server")
        else reserve.sglang_default_fraction,
        planner_rule_fraction=reserve.sglang_default_fraction,
        kv_cache_dtype=c.kv_cache_dtype,
        cell_bytes=c.cell,
        cell_bytes_exact=round(c.exact, 3),
        full_cell_bytes=c.full_bytes,
        swa_cell_bytes=c.swa_bytes,
        weight_bytes_per_rank=p.weight_bytes_per_rank,
        kv_tokens_per_rank=tokens,
        kv_bytes_per_rank=int(tokens * c.exact),
        swa_tokens_per_rank=p.swa_tokens,
        mamba_slots_per_rank=p.mamba_slots,
        mamba_state_bytes=c.mamba_state_bytes,
        mamba_request_cap=p.mamba_request_cap,
        avg_tokens=avg_tokens,
        concurrent_requests=lay.kv_pools * per_worker_fit,
        hierarchical_cache=hicache,
        host_pool_tokens_per_rank=host_tokens,
        host_ram_needed_bytes=int(host_tokens * c.exact) * lay.ranks,
        max_running_requests=p.max_running_requests * lay.kv_pools,
        max_running_requests_per_worker=p.max_running_requests,
        max_running_requests_source=p.max_running_source,
        cuda_graph_max_bs_decode=reserve.decode_graph_max_bs,
        chunked_prefill_size=chunk,
        schedule_conservativeness=round(conservativeness, 6),
        ranks=lay.ranks,
        replicas=lay.dp_size,
        attn_dp_size=lay.attn_dp_size,
        kv_pools=lay.kv_pools,
        nnodes=share.nnodes,
        ranks_per_node=share.ranks_per_node,
        host_ram_needed_bytes_per_node=int(host_tokens * c.exact) * share.ranks_per_node,
        **_tokens_source(model, levers, tokens),
    )


def _tokens_source(model: ModelSpec, levers: Mapping[str, Any], tokens: int) -> dict[str, Any]:
    """Where a set's KV tokens come from (``Capacity.kv_tokens_source``)."""
    served = model.served
    if served is None:
        return {}
    if served.serves(levers):
        return {
            "kv_tokens_source": "the running server's own sizing",
            "formula_kv_tokens_per_rank": served.formula_kv_tokens,
        }
    if served.unseen_bytes_per_rank:
        return {"kv_tokens_source": "formula, scaled by the running server's own sizing"}
    return {}


# --- live load ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveLoad:
    """What the running server says about its load (SGLang's gauges)."""

    running_requests: float | None = None
    queued_requests: float | None = None
    token_usage: float | None = None
    gen_tokens_per_s: float | None = None
    cache_hit_rate: float | None = None
    max_total_num_tokens: int | None = None
    #: KV tokens in use over every DP worker's pool (SGLang's ``num_used_tokens``, summed).
    used_tokens: float | None = None
    #: KV pools (DP workers), each of ``max_total_num_tokens``: the fallback without
    #: ``used_tokens`` scales the fullest pool's usage by them.
    kv_pools: int = 1
    #: The prefix cache over the recent window (``planner.prefixcache``; None: not known).
    prefix_cache: PrefixEvidence | None = None
    #: The kind the daemon's diagnosis held for ``[timeouts] diagnosis_hold_s`` (None:
    #: none held). A held saturated kind wins over one sample of the gauges: a KV-bound
    #: server's usage dips below the threshold between samples while its queue stays.
    held: LoadKind | None = None

    def kind(self) -> LoadKind:
        """The bottleneck: a held KV- or queue-bound diagnosis, else these gauges'. A held
        "not saturated" (or "no metrics") is not taken over the sample: it lags a load
        that has just grown, and the plan is asked for because of that load."""
        if self.held in (LoadKind.KV_BOUND, LoadKind.QUEUE_BOUND):
            return self.held
        return classify(self.running_requests, self.queued_requests, self.token_usage)

    def avg_tokens(self) -> int | None:
        """KV tokens per running request: the used tokens over the running requests (both
        summed over the DP workers), else ``token_usage × max_total_num_tokens × pools /
        running``."""
        if not self.running_requests:
            return None
        if self.used_tokens:
            value = round(self.used_tokens / self.running_requests)
            return value if value > 0 else None
        if self.token_usage is None or not self.max_total_num_tokens:
            return None
        pools = max(1, self.kv_pools)
        value = round(self.token_usage * self.max_total_num_tokens * pools / self.running_requests)
        return value if value > 0 else None

    def diagnosis(self) -> str:
        """Where the bottleneck is, in one sentence (the rule: ``planner.diagnosis``)."""
        return sentence(self.running_requests, self.queued_requests, self.token_usage, self.kind())

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "prefix_cache"}
        out["prefix_cache"] = None if self.prefix_cache is None else self.prefix_cache.to_json()
        return out
