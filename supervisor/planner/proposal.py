"""The proposal: every lever the measured bottleneck supports, sized for this model and
machine, each with its effect and cost, and the change's expected time without service."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sglang_supervisor.planner.bottleneck import CAPACITY_LEVERS, RUNNING_CAP_LEVERS, supported
from sglang_supervisor.planner.capacity import Capacity, Hardware, LiveLoad, capacity
from sglang_supervisor.planner.cells import is_fp8
from sglang_supervisor.planner.downtime import ChangeFacts, ServerFacts, expected
from sglang_supervisor.planner.hostplan import host_cache, host_cache_budget_per_rank
from sglang_supervisor.planner.inputs import lever_int
from sglang_supervisor.planner.leverfx import effects_and_costs, graphs, stop_notes
from sglang_supervisor.planner.memory import (
    LARGE_GPU_MIB,
    MIN_ACTIVATION_TOKENS,
    round_up_graph_bs,
    sglang_default_chunked_prefill,
    sglang_reserve,
)
from sglang_supervisor.planner.model import MiB, ModelShape, ModelSpec, PlanError
from sglang_supervisor.planner.nodes import NodeShare, candidate_node_problem
from sglang_supervisor.planner.notes import honest_notes
from sglang_supervisor.planner.pools import Pools, pools
from sglang_supervisor.planner.prefixcache import host_cache_verdict
from sglang_supervisor.planner.report import LeverNote, Plan, in_effect, reason
from sglang_supervisor.planner.sharding import head_problem
from sglang_supervisor.sglang.layout import Layout

#: The fp8 KV dtype the planner proposes (e4m3: more mantissa, the usual choice).
PROPOSED_FP8_DTYPE = "fp8_e4m3"
#: Largest decode CUDA-graph batch the planner proposes (each captured size costs
#: ~2 MiB of reserve; SGLang's own largest default is 512).
MAX_PROPOSED_GRAPH_BS = 1024

#: A check of a lever set by SGLang itself: None when it accepts, else why not.
Validator = Callable[[Mapping[str, Any]], "str | None"]
#: SGLang's own resolved values for a lever set (None: SGLang could not be asked).
Resolver = Callable[[Mapping[str, Any]], "Mapping[str, Any] | None"]

#: The order the proposal lists its levers in (the biggest effect on capacity first).
_LEVER_ORDER = {
    name: i
    for i, name in enumerate(
        (
            "attn_dp_size",
            "kv_cache_dtype",
            "mem_fraction_static",
            "chunked_prefill_size",
            "max_running_requests",
            "cuda_graph_max_bs_decode",
            "enable_hierarchical_cache",
            "hicache_size",
        )
    )
}


def _chunk_under_floor(
    gpu_bytes: int, levers: Mapping[str, Any], shape: ModelShape, start: int
) -> int:
    """The largest of ``start``, ``start / 2``, ... (≥ 2048) whose reserve stays within
    SGLang's 10 GiB floor; ``start`` when none does, or on GPUs ≤ 60 GiB (no floor)."""
    if gpu_bytes / MiB <= LARGE_GPU_MIB:
        return start
    chunk = start
    while chunk >= MIN_ACTIVATION_TOKENS:
        reserve = sglang_reserve(gpu_bytes, {**levers, "chunked_prefill_size": chunk}, shape)
        if reserve.total_mib - reserve.parts_mib.get("deepep_a2a", 0.0) <= reserve.floor_mib:
            return chunk
        chunk //= 2
    return start


def _tune(
    model: ModelSpec,
    hardware: Hardware,
    current: Mapping[str, Any],
    base: dict[str, Any],
    *,
    avg_tokens: int,
    target_concurrency: int | None,
) -> dict[str, Any]:
    """fp8 KV, chunk, fraction, running requests and graphs on ``base``."""
    gpu = hardware.gpu_memory_bytes
    shape = model.shape
    new = dict(base)
    lay = Layout.of(new)
    now = capacity(model, new, gpu, avg_tokens)
    if not is_fp8(now.kv_cache_dtype):
        new["kv_cache_dtype"] = PROPOSED_FP8_DTYPE
    default_chunk = sglang_default_chunked_prefill(gpu / MiB)
    cur_chunk = lever_int(current, "chunked_prefill_size")
    start = cur_chunk if cur_chunk is not None and cur_chunk > 0 else default_chunk
    chunk = _chunk_under_floor(gpu, new, shape, start)
    if chunk != (cur_chunk if cur_chunk is not None else default_chunk):
        new["chunked_prefill_size"] = chunk
    # Fraction, concurrency and graphs depend on each other: iterate to a fixed point.
    for _ in range(4):
        new["mem_fraction_static"] = sglang_reserve(gpu, new, shape).safe_fraction
        p = pools(model, {**new, "max_running_requests": None}, gpu)
        running, bs = _running_cap(p, lay, avg_tokens, target_concurrency)
        if new.get("max_running_requests") == running and new.get("cuda_graph_max_bs_decode") == bs:
            break
        new["max_running_requests"] = running
        new["cuda_graph_max_bs_decode"] = bs
    new["mem_fraction_static"] = min(
        new["mem_fraction_static"], sglang_reserve(gpu, new, shape).safe_fraction
    )
    if new["mem_fraction_static"] <= 0:
        reserve = sglang_reserve(gpu, new, shape)
        raise PlanError(
            f"SGLang 0.5.23 reserves {reserve.total_mib:.0f} MiB of each {gpu / MiB:.0f} MiB "
            "GPU for activations and CUDA graphs: nothing is left for the weights and the KV "
            "cache; use GPUs with more memory"
        )
    return new


def _running_cap(
    p: Pools, lay: Layout, avg_tokens: int, target_concurrency: int | None
) -> tuple[int, int]:
    """``max_running_requests`` = the requests that fit at ``avg_tokens`` (or the target,
    if lower) and the decode-graph batch that covers one worker's share."""
    fit = p.kv_tokens // avg_tokens
    if p.mamba_request_cap is not None:
        fit = min(fit, p.mamba_request_cap)
    per_worker = max(1, fit)
    if target_concurrency:
        per_worker = max(1, min(per_worker, -(-target_concurrency // lay.kv_pools)))
    running = per_worker * lay.attn_dp_size
    if target_concurrency:
        running = min(running, target_concurrency)
    return running, min(round_up_graph_bs(per_worker), MAX_PROPOSED_GRAPH_BS)


def _raise_the_cap(
    model: ModelSpec, hardware: Hardware, current: Mapping[str, Any], avg_tokens: int
) -> dict[str, Any]:
    """Queue-bound at the cap: only ``max_running_requests`` (and its graphs), on today's
    KV pool, where it raises the cap."""
    new = dict(current)
    gpu = hardware.gpu_memory_bytes
    p = pools(model, {**new, "max_running_requests": None}, gpu)
    running, bs = _running_cap(p, Layout.of(new), avg_tokens, None)
    if running > capacity(model, new, gpu, avg_tokens).max_running_requests:
        new["max_running_requests"] = running
        new["cuda_graph_max_bs_decode"] = max(bs, lever_int(new, "cuda_graph_max_bs_decode") or 0)
    return new


def attention_dp_candidate(model: ModelSpec, levers: Mapping[str, Any]) -> dict[str, Any] | None:
    """``levers`` with attention DP over the whole TP group, for an MLA model whose TP
    ranks all store the same latent KV today; None when it does not apply."""
    lay = Layout.of(levers)
    if not model.shape.is_mla or lay.tp_size < 2 or lay.attn_dp_size > 1 or lay.dp_size > 1:
        return None
    return {**levers, "attn_dp_size": lay.tp_size}


def propose(
    model: ModelSpec,
    hardware: Hardware,
    current_levers: Mapping[str, Any],
    *,
    avg_tokens: int,
    avg_tokens_source: str = "given",
    target_concurrency: int | None = None,
    live: LiveLoad | None = None,
    validate: Validator | None = None,
    resolve: Resolver | None = None,
    facts: ServerFacts | None = None,
) -> Plan:
    """Every lever the measured bottleneck supports (``planner.bottleneck``), sized for
    this model and machine, each with its effect and cost (``planner.leverfx``).

    The capacity levers, in order: attention DP for MLA models when it raises capacity;
    fp8 KV (unless the checkpoint already stores fp8); a chunked-prefill size within
    SGLang's 10 GiB reserve floor; the highest safe ``mem_fraction_static``;
    ``max_running_requests`` = requests that fit at ``avg_tokens`` (or the target) and
    ``cuda_graph_max_bs_decode`` covering one worker's batch. The hierarchical cache only
    where the live prefix cache's evidence supports it (``planner.prefixcache``), sized to
    the host RAM left after SGLang's margin and OS headroom and to the stop budget. TP/PP/DP
    are never changed. ``validate`` (SGLang's own resolution, where installed) checks each
    candidate: one it refuses is never proposed; ``resolve`` gives SGLang's own resolved
    values for the current levers (its default fraction replaces the planner's copy of the
    rule). ``facts``: the daemon's timeouts and what it measured of the serving server,
    for the expected time without service (``planner.downtime``).

    With ``nnodes`` > 1 in the levers, ``hardware`` is one node's (GPUs, host RAM) and each
    node holds ``tp×pp/nnodes`` ranks (``planner.nodes``); a candidate that would raise
    ``nnodes`` or break ``tp×pp % nnodes == 0`` is skipped with a note.

    Raises ``PlanError`` when the lever set needs more GPUs (per node) than ``hardware``
    has, SGLang cannot place it on its nodes, or the inputs are out of range.
    """
    if avg_tokens <= 0:
        raise PlanError(f"avg_tokens must be positive, got {avg_tokens}")
    if hardware.gpu_memory_bytes <= 0 or hardware.gpus <= 0:
        raise PlanError("the GPU count and GPU memory must be positive")
    if target_concurrency is not None and target_concurrency <= 0:
        raise PlanError(f"target_concurrency must be positive, got {target_concurrency}")
    current = dict(current_levers)
    shape = Layout.of(current)
    share = NodeShare.of(current)
    if share.nnodes > 1:
        # Several nodes: hardware.gpus is one node's; each node runs its share of the ranks.
        why = share.problem(current)
        if why is not None:
            raise PlanError(f"the current levers cannot be placed on their nodes: {why}")
        if share.gpus_needed_per_node > hardware.gpus:
            raise PlanError(
                f"{shape.describe_sizes()} over nnodes {share.nnodes} puts "
                f"{share.ranks_per_node} ranks on each node, needing "
                f"{share.gpus_needed_per_node} GPUs per node, but the plan has "
                f"{hardware.gpus} per node; give the GPUs of one node, or raise nnodes"
            )
    elif shape.gpus_needed > hardware.gpus:
        raise PlanError(
            f"{shape.describe()} needs {shape.gpus_needed} GPUs but the plan has "
            f"{hardware.gpus}; give more GPUs or lower tp_size/dp_size in the current levers"
        )
    m = model.shape
    bad = head_problem(m.num_attention_heads, m.num_kv_heads, m.is_mla, current, model.source)
    if bad is not None:
        raise PlanError(bad[1])
    gpu, host = hardware.gpu_memory_bytes, hardware.host_ram_available_bytes
    now = capacity(
        model, current, gpu, avg_tokens, host, resolved=resolve(current) if resolve else None
    )
    refused: list[str] = []
    skipped: list[str] = []

    def accepted(levers: dict[str, Any]) -> bool:
        # A candidate never breaks the node layout: SGLang would refuse it, and the nodes
        # are the allocation's (planner.nodes).
        broken = candidate_node_problem(current, levers)
        if broken is not None:
            skipped.append(
                f"A candidate lever set was skipped: {broken}; the proposal keeps "
                f"tp_size × pp_size divisible by nnodes {share.nnodes}"
            )
            return False
        if validate is None:
            return True
        why = validate(levers)
        if why is not None:
            refused.append(why)
        return why is None

    live_now = live is not None and live.running_requests is not None
    support = supported(
        live.running_requests if live else None,
        live.queued_requests if live else None,
        live.token_usage if live else None,
        live=live_now,
        max_running_requests=now.max_running_requests,
        target_concurrency=target_concurrency,
        kind=live.kind() if live_now and live is not None else None,
    )
    tune = {"avg_tokens": avg_tokens, "target_concurrency": target_concurrency}
    dp_after: Capacity | None = None
    if support.levers == CAPACITY_LEVERS:
        new = _tune(model, hardware, current, current, **tune)  # type: ignore[arg-type]
    elif support.levers == RUNNING_CAP_LEVERS:
        new = _raise_the_cap(model, hardware, current, avg_tokens)
    else:
        new = dict(current)
    verdict = host_cache_verdict(live.prefix_cache if live else None)
    new = host_cache(model, hardware, new, propose=verdict.supported)
    after = capacity(model, new, gpu, avg_tokens, host)
    if not accepted(new):
        new, after = dict(current), now
    dp_base = attention_dp_candidate(model, current) if support.levers == CAPACITY_LEVERS else None
    if dp_base is not None:
        dp_new = _tune(model, hardware, current, dp_base, **tune)  # type: ignore[arg-type]
        dp_new = host_cache(model, hardware, dp_new, propose=verdict.supported)
        dp_after = capacity(model, dp_new, gpu, avg_tokens, host)
        if dp_after.concurrent_requests > after.concurrent_requests and accepted(dp_new):
            new, after = dp_new, dp_after
    changes = {
        k: new[k]
        for k in sorted(new, key=lambda k: _LEVER_ORDER.get(k, len(_LEVER_ORDER)))
        if current.get(k) != new[k]
    }
    ranks = after.ranks_per_node  # host RAM is one node's: its ranks share it
    budget = host_cache_budget_per_rank(host, ranks, hardware.stop)
    facts = facts or ServerFacts()
    evidence = live.prefix_cache if live else None
    fx = effects_and_costs(
        model, hardware, current, changes, now, after, facts=facts, evidence=evidence
    )
    notes = [
        LeverNote(
            lever,
            current[lever] if lever in current else in_effect(lever, now),
            value,
            reason(lever, now, after, gpu_bytes=gpu, budget=budget, ranks=ranks),
            current_is_default=lever not in current,
            effect=fx[lever]["effect"],
            cost=fx[lever]["cost"],
        )
        for lever, value in changes.items()
    ]
    honest = [support.why, f"Host cache: {verdict.reason}."]
    honest += honest_notes(
        model,
        hardware,
        current,
        new,
        now,
        after,
        dp_after=dp_after,
        budget=budget,
        target_concurrency=target_concurrency,
        refused=refused,
        host_cache_wanted=verdict.supported,
    )
    honest.extend(skipped)
    unbounded = host_cache_budget_per_rank(host, ranks)
    honest.extend(stop_notes(hardware, now, after, unbounded, budget))
    downtime = expected(
        ChangeFacts(
            facts,
            now.host_ram_needed_bytes_per_node,
            after.host_ram_needed_bytes_per_node,
            weights_ratio=after.weight_bytes_per_rank / max(1, now.weight_bytes_per_rank),
            graphs_now=graphs(now.cuda_graph_max_bs_decode),
            graphs_new=graphs(after.cuda_graph_max_bs_decode),
        )
    )
    return Plan(
        model=model,
        hardware=hardware,
        avg_tokens=avg_tokens,
        avg_tokens_source=avg_tokens_source,
        target_concurrency=target_concurrency,
        diagnosis=(live or LiveLoad()).diagnosis(),
        current_levers=current,
        current=now,
        proposed=after,
        levers=changes,
        lever_notes=notes,
        notes=honest,
        live=live,
        reserve=sglang_reserve(gpu, new, model.shape).to_json(),
        bottleneck={
            "kind": None if support.kind is None else str(support.kind),
            "levers": sorted(support.levers),
            "why": support.why,
        },
        host_cache={"supported": verdict.supported, "reason": verdict.reason},
        expected_downtime=downtime if changes else None,
        rates=facts.rates,
    )
