"""The hierarchical cache's pinned host pool for an explicit ``hicache_ratio``, sized as
SGLang 0.5.23 sizes it: from the rank's real device KV pool, not from the GPU's memory.

(Paths under ``sglang/srt/``.) ``mem_cache/pool_host/base.py:215-229``: ``size =
int(device_capacity_tokens × hicache_ratio)``, then whole pages plus one padding page
(``page_num = size // page_size + 1``); it pins ``size × size_per_token`` bytes
(``:249``), ``size_per_token`` being the device pool's bytes per token over its layers
(``pool_host/mha.py:290-296``, ``pool_host/mla.py:301-302``). A hybrid sliding-window
model gets a second host pool for its SWA layers at the same ratio
(``mem_cache/hybrid_cache/hybrid_pool_assembler.py:407,482``).

The device pool comes from the same numbers the planner computes (``pools``): the
weights per rank, SGLang's fraction and cells. Where the model is unknown (no
config.json on this host) the pool cannot be sized: callers warn rather than refuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sglang_supervisor.planner.inputs import lever_bool, lever_float, lever_int
from sglang_supervisor.planner.model import GB, ModelSpec
from sglang_supervisor.planner.pools import page_size, pools, resolved_storage


@dataclass(frozen=True)
class DevicePool:
    """One rank's device KV pool: what a ratio-sized host pool is a multiple of."""

    tokens: int
    swa_tokens: int
    full_cell_bytes: int
    swa_cell_bytes: int
    page_size: int

    @classmethod
    def of(
        cls,
        model: ModelSpec,
        levers: Mapping[str, Any],
        gpu_bytes: int,
        resolved: Mapping[str, Any] | None = None,
    ) -> DevicePool:
        """The device pool ``levers`` give on a GPU of ``gpu_bytes`` (``resolved``:
        SGLang's own resolved fraction and page size, where it answered)."""
        sized = dict(levers)
        fraction = (resolved or {}).get("mem_fraction_static")
        if lever_float(levers, "mem_fraction_static") is None and isinstance(fraction, float):
            sized["mem_fraction_static"] = fraction
        page = (resolved or {}).get("page_size")
        if lever_int(levers, "page_size") is None and isinstance(page, int) and page > 1:
            sized["page_size"] = page
        sized.update(resolved_storage(levers, resolved))
        p = pools(model, sized, gpu_bytes)
        return cls(
            tokens=p.kv_tokens,
            swa_tokens=p.swa_tokens,
            full_cell_bytes=p.cells.full_bytes,
            swa_cell_bytes=p.cells.swa_bytes,
            page_size=page_size(model, sized),
        )

    def host_bytes(self, ratio: float) -> int:
        """Pinned bytes of the host pools at ``ratio`` (``pool_host/base.py:226-229``)."""

        def one(tokens: int, cell: int) -> int:
            size = int(tokens * ratio)
            return (size // self.page_size + 1) * self.page_size * cell

        total = one(self.tokens, self.full_cell_bytes)
        if self.swa_tokens and self.swa_cell_bytes:
            total += one(self.swa_tokens, self.swa_cell_bytes)
        return total


def ratio_host_bytes_per_rank(levers: Mapping[str, Any], device: DevicePool | None) -> int | None:
    """Pinned host bytes one rank's hierarchical cache takes for an explicit
    ``hicache_ratio`` (``hicache_size`` unset); 0 when the cache is off or sized
    otherwise; None when the ratio is explicit but the device pool is unknown."""
    if not lever_bool(levers, "enable_hierarchical_cache"):
        return 0
    if (lever_int(levers, "hicache_size") or 0) > 0:
        return 0
    ratio = lever_float(levers, "hicache_ratio")
    if ratio is None:
        return 0
    if device is None:
        return None
    return device.host_bytes(ratio)


def describe(device: DevicePool) -> str:
    """The device pool in the operator's words (for refusals that quote it)."""
    full = device.tokens * device.full_cell_bytes
    swa = device.swa_tokens * device.swa_cell_bytes
    return f"{device.tokens:,} tokens, {(full + swa) / GB:.1f} GB"
