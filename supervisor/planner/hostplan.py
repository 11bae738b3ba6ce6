"""The host cache in a proposal: proposed only on the prefix cache's evidence
(``planner.prefixcache``), sized to the host RAM left after SGLang's margin and OS
headroom and to the service's stop budget (``planner.stopcost``), never where SGLang
refuses one; an operator's host cache that does not fit is shrunk or turned off."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sglang_supervisor.planner.capacity import Hardware
from sglang_supervisor.planner.hicache import (
    SGLANG_HOST_RAM_MARGIN,
    auto_sized,
    host_pool_bytes_per_rank,
)
from sglang_supervisor.planner.inputs import lever_bool
from sglang_supervisor.planner.model import GB, GiB, ModelSpec
from sglang_supervisor.planner.nodes import NodeShare
from sglang_supervisor.planner.pools import pools
from sglang_supervisor.planner.stopcost import StopBudget

#: Host RAM the planner leaves to the OS, page cache, the tokenizer and detokenizer and the
#: daemon, on top of SGLang's margin: 10% of what is available, at least 8 GiB.
OS_HEADROOM_FRACTION = 0.10
OS_HEADROOM_MIN_BYTES = 8 * GiB


def host_cache_budget_per_rank(
    host_ram_available_bytes: int, ranks: int, stop: StopBudget | None = None
) -> int:
    """Bytes of pinned host pool one rank may take: (available − SGLang's 10 GiB margin −
    OS headroom) / ranks, never negative. The total always fits SGLang's own check; with
    ``stop``, its teardown deadline also fits the service's stop budget (unpinning is
    slow: ``sglang_supervisor.planner.stopcost``)."""
    headroom = max(OS_HEADROOM_MIN_BYTES, int(host_ram_available_bytes * OS_HEADROOM_FRACTION))
    budget = host_ram_available_bytes - SGLANG_HOST_RAM_MARGIN - headroom
    per_rank = max(0, budget // max(1, ranks))
    cap = stop.max_pinned_bytes() if stop is not None else None
    return per_rank if cap is None else min(per_rank, cap // max(1, ranks))


def hicache_refused(levers: Mapping[str, Any]) -> str | None:
    """Why SGLang refuses the hierarchical cache with ``levers`` (None: it does not)."""
    if lever_bool(levers, "disable_radix_cache"):
        return "disable_radix_cache is set (the hierarchical cache extends the radix cache)"
    if lever_bool(levers, "enable_lmcache"):
        return "enable_lmcache is set (LMCache and the hierarchical cache exclude each other)"
    return None


def host_cache(
    model: ModelSpec, hardware: Hardware, base: dict[str, Any], *, propose: bool
) -> dict[str, Any]:
    """The host cache on ``base``: proposed where ``propose`` (the prefix cache's
    evidence) and SGLang accepts one and its stop fits the service's budget; an operator's
    host cache that does not fit is shrunk (or turned off) whatever the evidence."""
    new = dict(base)
    gpu = hardware.gpu_memory_bytes
    per_node = NodeShare.of(new).ranks_per_node  # host RAM is each node's own
    budget = host_cache_budget_per_rank(hardware.host_ram_available_bytes, per_node, hardware.stop)
    p = pools(model, new, gpu)
    size_gb = budget // GB
    host_tokens = int(size_gb * GB // max(1.0, p.cells.exact))
    if propose and hicache_refused(new) is None and size_gb >= 1 and host_tokens > p.kv_tokens:
        new["enable_hierarchical_cache"] = True
        new["hicache_size"] = int(size_gb)
    elif lever_bool(new, "enable_hierarchical_cache") and (
        host_pool_bytes_per_rank(new, gpu, hardware.host_ram_available_bytes) > budget
        or (auto_sized(new) and hardware.host_ram_available_bytes <= SGLANG_HOST_RAM_MARGIN)
    ):
        # The operator's host cache does not fit (or SGLang's auto-sizing finds nothing
        # left after its margin and refuses): shrink it, or turn it off.
        if size_gb >= 1:
            new["hicache_size"] = int(size_gb)
        else:
            new["enable_hierarchical_cache"] = False
    return new
