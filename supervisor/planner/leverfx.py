"""What each proposed lever does, in the measured bottleneck's unit, and what it costs in
seconds of stop and start; what a stop of each set costs against the service's budget.

Effects are taken in the proposal's order (``proposal._LEVER_ORDER``), each on top of the
ones before it, so they add up to the plan's current → proposed: KV tokens per rank and
requests running at once (the fewer of what fits at the average length and
``max_running_requests``) for the capacity levers; the cache hit rate for the hierarchical
cache, with how long an evicted prefix is kept now and with the host pool.

Costs (``planner.downtime`` has the figures and where they come from): the host pool's
pinning at start and unpinning at stop; more decode CUDA graphs to capture; the weights
attention DP replicates on every GPU, at the serving server's measured start. The pools'
sizes themselves cost nothing measurable (one allocation).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sglang_supervisor.planner.capacity import Capacity, Hardware, capacity
from sglang_supervisor.planner.downtime import ServerFacts
from sglang_supervisor.planner.memory import decode_graph_sizes
from sglang_supervisor.planner.model import GB, GiB, ModelSpec
from sglang_supervisor.planner.prefixcache import PrefixEvidence
from sglang_supervisor.planner.stopcost import PinRates

_HOST_CACHE = ("enable_hierarchical_cache", "hicache_size")


@dataclass(frozen=True)
class Effect:
    #: "requests running at once", "cache hit rate", "decode batch replayed by a graph".
    unit: str
    now: float | None
    #: None: not predicted (``text`` says what is expected).
    expected: float | None
    text: str


@dataclass(frozen=True)
class Cost:
    #: Seconds added to a stop and to a start (negative: saved; None: not known here).
    stop_s: float | None
    start_s: float | None
    basis: str


def to_json(effect: Effect, cost: Cost) -> dict[str, Any]:
    e = asdict(effect)
    c = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in asdict(cost).items()}
    return {"effect": e, "cost": c}


def running_at_once(c: Capacity) -> int:
    """Requests that run at once: what fits at the average length, within the cap."""
    return min(c.concurrent_requests, c.max_running_requests)


def graphs(bs: int | None) -> int | None:
    return None if not bs else len(decode_graph_sizes(bs))


def effects_and_costs(
    model: ModelSpec,
    hardware: Hardware,
    current: Mapping[str, Any],
    changes: Mapping[str, Any],
    now: Capacity,
    after: Capacity,
    *,
    facts: ServerFacts,
    evidence: PrefixEvidence | None,
) -> dict[str, dict[str, Any]]:
    """``{lever: {"effect": ..., "cost": ...}}`` for every change, in order."""
    out: dict[str, dict[str, Any]] = {}
    levers, before = dict(current), now
    gpu, host, avg = hardware.gpu_memory_bytes, hardware.host_ram_available_bytes, now.avg_tokens
    for lever, value in changes.items():
        levers[lever] = value
        if lever in _HOST_CACHE:
            first = next(k for k in changes if k in _HOST_CACHE)
            if lever == first:
                out[lever] = to_json(*_host_cache(now, after, facts.rates, evidence))
            else:  # one host pool: its effect and cost are stated once
                out[lever] = {
                    "effect": None,
                    "cost": asdict(Cost(0.0, 0.0, f"counted with {first}")),
                }
            continue
        step = capacity(model, levers, gpu, avg, host)
        if lever == "cuda_graph_max_bs_decode":
            # Against today's graphs: the cap before it already moves SGLang's default.
            out[lever] = to_json(*_graphs(now, step, facts))
        elif lever == "max_running_requests":
            effect = Effect(
                "requests running at once",
                running_at_once(before),
                running_at_once(step),
                f"the cap {before.max_running_requests:,} -> {step.max_running_requests:,}: "
                f"{step.kv_tokens_per_rank:,} KV tokens per pool hold "
                f"{step.concurrent_requests:,} requests of {avg:,} tokens",
            )
            out[lever] = to_json(effect, _no_time())
        else:
            gained = step.kv_tokens_per_rank - before.kv_tokens_per_rank
            effect = Effect(
                "requests running at once",
                running_at_once(before),
                running_at_once(step),
                f"KV tokens per rank {before.kv_tokens_per_rank:,} -> "
                f"{step.kv_tokens_per_rank:,} ({gained:+,})",
            )
            cost = _weights(before, step, facts) if lever == "attn_dp_size" else _no_time()
            out[lever] = to_json(effect, cost)
        before = step
    return out


def _no_time() -> Cost:
    return Cost(0.0, 0.0, "sizes the pools at start: no time of its own")


def _graphs(before: Capacity, step: Capacity, facts: ServerFacts) -> tuple[Effect, Cost]:
    old, new = graphs(before.cuda_graph_max_bs_decode), graphs(step.cuda_graph_max_bs_decode)
    effect = Effect(
        "decode batch replayed by a CUDA graph",
        before.cuda_graph_max_bs_decode,
        step.cuda_graph_max_bs_decode,
        f"decode batches up to {step.cuda_graph_max_bs_decode} replay a captured graph "
        f"(now up to {before.cuda_graph_max_bs_decode}); larger ones run eagerly, slower",
    )
    more = (new or 0) - (old or 0)
    what = f"{more} more" if more >= 0 else f"{-more} fewer"
    if facts.graph_s_each is None:
        cost = Cost(0.0, None, f"{what} decode graphs to capture at start (not timed here)")
    else:
        cost = Cost(
            0.0,
            more * facts.graph_s_each,
            f"{what} decode graphs × {facts.graph_s_each:.2f} s each (the serving server's "
            "capture, from its log)",
        )
    return effect, cost


def _weights(before: Capacity, step: Capacity, facts: ServerFacts) -> Cost:
    extra = step.weight_bytes_per_rank - before.weight_bytes_per_rank
    what = f"{extra / GB:+,.1f} GB of weights per GPU to load (the attention weights replicated)"
    if facts.measured_start_s is None or before.weight_bytes_per_rank <= 0:
        return Cost(0.0, None, f"{what}; not timed here")
    per_byte = facts.measured_start_s / before.weight_bytes_per_rank
    return Cost(
        0.0,
        extra * per_byte,
        f"{what}, at the serving server's start ({facts.measured_start_s:.1f} s for "
        f"{before.weight_bytes_per_rank / GB:,.1f} GB per GPU, its whole start counted)",
    )


def _host_cache(
    now: Capacity, after: Capacity, rates: PinRates, evidence: PrefixEvidence | None
) -> tuple[Effect, Cost]:
    old, new = now.host_ram_needed_bytes_per_node, after.host_ram_needed_bytes_per_node
    host_tokens = after.host_pool_tokens_per_rank * after.kv_pools
    hit = None if evidence is None else evidence.hit_rate
    kept = None if evidence is None else evidence.retention_s(evidence.evictable_tokens)
    longer = None if evidence is None else evidence.retention_s(host_tokens)
    if longer is not None and evidence is not None:
        text = (
            f"evicted prefixes kept ≈{longer:,.0f} s more in host RAM ({host_tokens:,} "
            f"tokens at today's {evidence.evicted_tokens_per_s or 0:,.0f} evicted/s"
            + (f"; ≈{kept:.2g} s in the device pool now)" if kept is not None else ")")
            + ": reused ones load back instead of being recomputed, so the hit rate rises "
            "and prefills shrink; not more requests at once"
        )
    else:
        text = f"{host_tokens:,} host tokens for evicted prefixes; not more requests at once"
    effect = Effect("cache hit rate", hit, None, text)
    cost = Cost(
        rates.unpin_s(new) - rates.unpin_s(old),
        rates.pin_s(new) - rates.pin_s(old),
        f"{new / GiB:,.0f} GiB pinned per node (now {old / GiB:,.0f}): unpinned at every stop "
        f"({rates.unpin_s_per_gib:g} s per GiB), pinned at every start "
        f"({rates.pin_s_per_gib:g} s per GiB), {rates.source}",
    )
    return effect, cost


def stop_notes(
    hardware: Hardware, now: Capacity, after: Capacity, unbounded: int, bounded: int
) -> list[str]:
    """What a stop of each set costs, where the service's stop budget bounds the plan
    (``unbounded``/``bounded``: a rank's host-cache budget without and with the stop
    budget)."""
    stop = hardware.stop
    if stop is None:
        return []
    notes = []
    proposed = stop.cost(after.host_ram_needed_bytes_per_node)
    if after.hierarchical_cache and bounded < unbounded:
        notes.append(
            f"Host cache kept to {proposed['pinned_host_gib']} GiB pinned (the RAM would "
            f"allow {unbounded * after.ranks_per_node / GiB:.0f} GiB): unpinning takes ≈0.2 s "
            f"per GiB, so a stop takes ≈{proposed['expected_stop_s']:.0f} s after the drain "
            f"and the daemon's deadline is {proposed['stop_deadline_s']:.0f} s, within the "
            f"service's stop budget of {stop.budget_s:.0f} s ([timeouts] stop_budget_s = the "
            "unit's TimeoutStopSec); raise both for a larger host cache"
        )
    current = stop.cost(now.host_ram_needed_bytes_per_node)
    if now.hierarchical_cache and not current["within_stop_budget"]:
        notes.append(
            f"The current host cache pins {current['pinned_host_gib']} GiB: a stop's "
            f"deadline is {current['stop_deadline_s']:.0f} s, past the service's stop "
            f"budget of {stop.budget_s:.0f} s — systemd would SIGKILL the daemon mid-stop; "
            "apply the proposal or raise TimeoutStopSec and [timeouts] stop_budget_s"
        )
    return notes
