"""What a plan says: the proposal's data, one line per changed lever, the honest notes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sglang_supervisor.planner.capacity import Capacity, Hardware, LiveLoad
from sglang_supervisor.planner.downtime import Downtime
from sglang_supervisor.planner.model import GB, ModelSpec
from sglang_supervisor.planner.stopcost import MEASURED_RATES, PinRates


@dataclass(frozen=True)
class LeverNote:
    lever: str
    #: The value in effect now (SGLang's default when the lever is unset).
    current: Any
    proposed: Any
    reason: str
    #: True when the lever is unset now and ``current`` is SGLang's default.
    current_is_default: bool = False
    #: What it does in the measured bottleneck's unit (``unit``, ``now``, ``expected``,
    #: ``text``) and what it costs (``stop_s``, ``start_s``, ``basis``): planner.leverfx.
    effect: dict[str, Any] | None = None
    cost: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    hardware: Hardware
    avg_tokens: int
    avg_tokens_source: str
    target_concurrency: int | None
    diagnosis: str
    current_levers: dict[str, Any]
    current: Capacity
    proposed: Capacity
    #: The changes to submit (merged onto the current levers), each passing check_levers.
    levers: dict[str, Any]
    lever_notes: list[LeverNote]
    notes: list[str]
    live: LiveLoad | None = None
    reserve: dict[str, Any] = field(default_factory=dict)
    #: The bottleneck measured and the levers it supports (``planner.bottleneck``).
    bottleneck: dict[str, Any] = field(default_factory=dict)
    #: Whether the prefix cache's evidence supports a host cache, and why.
    host_cache: dict[str, Any] = field(default_factory=dict)
    #: The change's expected time without service (None: nothing changes).
    expected_downtime: Downtime | None = None
    rates: PinRates = MEASURED_RATES

    @property
    def proposed_levers(self) -> dict[str, Any]:
        return {**self.current_levers, **self.levers}

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model.to_json(),
            "hardware": self.hardware.to_json(),
            "workload": {
                "avg_tokens": self.avg_tokens,
                "avg_tokens_source": self.avg_tokens_source,
                "target_concurrency": self.target_concurrency,
                "live": None if self.live is None else self.live.to_json(),
            },
            "diagnosis": self.diagnosis,
            "current_levers": dict(self.current_levers),
            "current": self.current.to_json(),
            "proposed": self.proposed.to_json(),
            "levers": dict(self.levers),
            "lever_notes": [n.to_json() for n in self.lever_notes],
            "notes": list(self.notes),
            "bottleneck": dict(self.bottleneck),
            "host_cache": dict(self.host_cache),
            # Drain, stop, unpin, release, pin, load, probation: planner.downtime.
            "expected_downtime": None
            if self.expected_downtime is None
            else self.expected_downtime.to_json(),
            # What a stop and a start cost with each set's pinned host cache.
            "stop_cost": None
            if self.hardware.stop is None
            else {
                "current": self.hardware.stop.cost(
                    self.current.host_ram_needed_bytes_per_node, self.rates
                ),
                "proposed": self.hardware.stop.cost(
                    self.proposed.host_ram_needed_bytes_per_node, self.rates
                ),
            },
            "predicted": {
                "kv_tokens_per_rank_delta": self.proposed.kv_tokens_per_rank
                - self.current.kv_tokens_per_rank,
                "max_total_num_tokens": self.proposed.kv_tokens_per_rank,
                "concurrent_requests_delta": self.proposed.concurrent_requests
                - self.current.concurrent_requests,
            },
            "reserve": dict(self.reserve),
            # A server spanning nodes: the GPUs (and host RAM) given are one node's.
            "nodes": self.nodes(),
        }

    def nodes(self) -> dict[str, Any]:
        """Nodes, ranks per node and GPUs per node of the proposal (every node alike)."""
        p = self.proposed
        return {
            "nnodes": p.nnodes,
            "ranks": p.ranks,
            "ranks_per_node": p.ranks_per_node,
            "gpus_per_node": self.hardware.gpus,
            "gpu_memory_bytes_per_node": self.hardware.gpus * self.hardware.gpu_memory_bytes,
            "host_ram_needed_bytes_per_node": p.host_ram_needed_bytes_per_node,
        }


def in_effect(lever: str, now: Capacity) -> Any:
    """What an unset ``lever`` amounts to in SGLang (None where it derives it at start)."""
    return {
        "kv_cache_dtype": now.kv_cache_dtype,
        "mem_fraction_static": now.mem_fraction_static,
        "chunked_prefill_size": now.chunked_prefill_size,
        "cuda_graph_max_bs_decode": now.cuda_graph_max_bs_decode,
        "enable_hierarchical_cache": now.hierarchical_cache,
    }.get(lever)


def reason(
    lever: str, now: Capacity, after: Capacity, *, gpu_bytes: int, budget: int, ranks: int
) -> str:
    """One line on what changing ``lever`` does, with the numbers."""
    if lever == "attn_dp_size":
        return (
            f"attention data parallelism: each of the {after.attn_dp_size} attention groups "
            f"keeps its own KV pool instead of every rank storing the same latent KV: "
            f"{now.kv_pools} -> {after.kv_pools} pools, {now.concurrent_requests:,} -> "
            f"{after.concurrent_requests:,} requests of {after.avg_tokens:,} tokens at once "
            "(see the trade-off note)"
        )
    if lever == "kv_cache_dtype":
        return (
            f"8-bit K/V: {now.cell_bytes:,} -> {after.cell_bytes:,} bytes per token per rank, so "
            "the same memory holds twice the tokens (see the accuracy note)"
        )
    if lever == "mem_fraction_static":
        per_hundredth = int(0.01 * gpu_bytes // max(1, after.cell_bytes))
        return (
            f"the highest fraction within SGLang's own reserve for activations and CUDA "
            f"graphs ({after.safe_mem_fraction:.3f}); each 0.01 is {per_hundredth:,} more KV "
            "tokens per rank"
        )
    if lever == "chunked_prefill_size":
        return (
            f"prefill in chunks of {after.chunked_prefill_size:,} tokens keeps SGLang's "
            "activation reserve within its 10 GiB floor, leaving the rest to KV; long prompts "
            "take a few more prefill steps"
        )
    if lever == "max_running_requests":
        return (
            f"{after.kv_tokens_per_rank:,} KV tokens hold {after.concurrent_requests:,} requests "
            f"of {after.avg_tokens:,} tokens; admitting more makes SGLang retract (evict and "
            "recompute) running requests"
        )
    if lever == "cuda_graph_max_bs_decode":
        return (
            f"capture decode CUDA graphs up to batch {after.cuda_graph_max_bs_decode} so every "
            "decode batch the KV allows replays a graph (larger batches run eagerly, slower)"
        )
    if lever == "enable_hierarchical_cache":
        if not after.hierarchical_cache:
            return "not enough host RAM for a host pool larger than the device pool"
        return (
            "keep evicted prefixes in host RAM: a higher cache hit rate for shared prefixes, "
            "not more running requests"
        )
    if lever == "hicache_size":
        return (
            f"{after.host_pool_tokens_per_rank:,} host tokens per rank "
            f"({after.host_pool_tokens_per_rank / max(1, after.kv_tokens_per_rank):.1f}× the "
            f"device pool) = {after.host_ram_needed_bytes_per_node / GB:,.0f} GB pinned over "
            f"{ranks} ranks{' per node' if after.nnodes > 1 else ''}, "
            f"within the {budget * ranks / GB:,.0f} GB left after SGLang's 10 GiB margin and "
            "OS headroom"
        )
    return "changed by the plan"
