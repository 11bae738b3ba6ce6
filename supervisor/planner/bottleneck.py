"""Which levers the measured bottleneck supports: the proposal's one rule.

A lever is proposed only where the load's bottleneck — ``planner.diagnosis``'s rule on the
live server's gauges — says it helps:

- **KV-bound** (the pool full, a queue): the KV-capacity levers — attention DP, an fp8 KV
  cache, the chunk, the fraction, and ``max_running_requests`` with the decode graphs that
  cover it: more KV tokens per GPU let more requests run at once;
- **queue-bound** (a queue while the KV cache has room): only ``max_running_requests``
  (and its graphs), where the running requests are at today's cap; below it the limit is
  compute, which no lever of one server raises (more replicas do);
- **not saturated**: nothing — the plan shows what the capacity levers would give;
- **no live load** (an offline plan, or no metrics yet): the capacity levers, as sizing for
  the stated hardware;
- a ``target_concurrency`` is the operator's own goal: the capacity levers, up to it.

The hierarchical cache is apart (``planner.prefixcache``): a prefix cache, never for
concurrency, proposed only on the prefix cache's own evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_supervisor.planner.diagnosis import LoadKind, classify

#: The levers that raise (or spend) KV capacity.
CAPACITY_LEVERS = frozenset(
    {
        "attn_dp_size",
        "kv_cache_dtype",
        "mem_fraction_static",
        "chunked_prefill_size",
        "max_running_requests",
        "cuda_graph_max_bs_decode",
    }
)
#: The request cap and the decode graphs that must cover it.
RUNNING_CAP_LEVERS = frozenset({"max_running_requests", "cuda_graph_max_bs_decode"})
#: Running requests at or above this share of ``max_running_requests`` are at the cap.
AT_CAP = 0.95


@dataclass(frozen=True)
class Support:
    """The levers the evidence supports, and why, in one sentence."""

    #: The bottleneck measured (None: no live load).
    kind: LoadKind | None
    levers: frozenset[str]
    why: str


def supported(
    running: float | None,
    queued: float | None,
    usage: float | None,
    *,
    live: bool,
    max_running_requests: int,
    target_concurrency: int | None,
    kind: LoadKind | None = None,
) -> Support:
    """The rule (module docstring), on the live gauges (``live`` False: none); ``kind``
    the held diagnosis's (``LiveLoad.kind``), else the gauges are classified here."""
    if target_concurrency:
        return Support(
            (kind or classify(running, queued, usage)) if live else None,
            CAPACITY_LEVERS,
            f"the target of {target_concurrency:,} requests at once: the KV-capacity levers "
            "are sized for it",
        )
    if not live:
        return Support(
            None,
            CAPACITY_LEVERS,
            "no live load: the KV-capacity levers are proposed as sizing for this hardware "
            "(whether they help depends on the load)",
        )
    kind = kind or classify(running, queued, usage)
    if kind is LoadKind.KV_BOUND:
        return Support(
            kind,
            CAPACITY_LEVERS,
            "KV-bound: more KV tokens per GPU let more of the queued requests run at once",
        )
    if kind is LoadKind.QUEUE_BOUND:
        cap = max(1, max_running_requests)
        if (running or 0) >= AT_CAP * cap:
            return Support(
                kind,
                RUNNING_CAP_LEVERS,
                f"requests queue while the KV cache has room and {running or 0:,.0f} run, "
                f"at max_running_requests ({cap:,}): only a higher cap helps",
            )
        return Support(
            kind,
            frozenset(),
            f"requests queue while the KV cache has room and {running or 0:,.0f} run, below "
            f"max_running_requests ({cap:,}): the limit is compute, which no lever of this "
            "server raises; add replicas",
        )
    if kind is LoadKind.NOT_SATURATED:
        return Support(
            kind,
            frozenset(),
            "not saturated: no lever would make today's load faster; pass "
            "target_concurrency to size the server for a goal",
        )
    return Support(
        None,
        CAPACITY_LEVERS,
        "no live metrics: the KV-capacity levers are proposed as sizing for this hardware",
    )
