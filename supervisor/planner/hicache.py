"""The hierarchical cache's host pool, sized as SGLang 0.5.23 sizes it.

(Paths under ``sglang/srt/``.)

* ``hicache_size`` (decimal GB per rank) wins; else an explicit ``hicache_ratio`` ×
  the device pool; with neither, SGLang *auto-sizes*: ratio ``min(2.0, 0.95 ×
  hicache_host_memory_fraction (0.8) × (available − 10 GiB) / ranks / device pool
  bytes)`` (``arg_groups/hicache_hook.py:100-125``,
  ``mem_cache/hicache_auto_size.py:82-125``, ``mem_cache/pool_host/base.py:84-108``).
* "Available" is the host's available RAM bounded by the process's cgroup headroom
  (limit − usage + reclaimable page cache; ``mem_cache/host_memory.py:136-162``).
* SGLang refuses an explicit host pool larger than the available RAM minus 10 GiB.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from sglang_supervisor.planner.inputs import lever_bool, lever_float, lever_int
from sglang_supervisor.planner.model import GB, GiB
from sglang_supervisor.sglang.layout import Layout

#: SGLang refuses a host pool larger than the available RAM minus this margin
#: (``HICACHE_HOST_MEMORY_RESERVE_BYTES``).
SGLANG_HOST_RAM_MARGIN = 10 * GiB
#: SGLang's hicache_ratio when the hierarchical cache is on and no size is given.
DEFAULT_HICACHE_RATIO = 2.0
#: ``hicache_host_memory_fraction``'s default: the share of the available RAM auto-sizing
#: may take, and the slack it leaves for allocation overheads.
HICACHE_HOST_MEMORY_FRACTION = 0.8
AUTO_SIZE_SLACK = 0.05


def auto_sized(levers: Mapping[str, Any]) -> bool:
    """True when SGLang auto-sizes the host pool: on, with neither size nor ratio."""
    return (
        lever_bool(levers, "enable_hierarchical_cache")
        and (lever_int(levers, "hicache_size") or 0) <= 0
        and lever_float(levers, "hicache_ratio") is None
    )


def auto_ratio(device_pool_bytes: int, host_available_bytes: int, ranks: int) -> float:
    """The ratio SGLang's auto-sizing picks (≤ 2.0; ≤ 0 when nothing is left)."""
    budget = int((host_available_bytes - SGLANG_HOST_RAM_MARGIN) // max(1, ranks))
    budget = int(budget * HICACHE_HOST_MEMORY_FRACTION)
    if device_pool_bytes <= 0:
        return DEFAULT_HICACHE_RATIO
    return min(DEFAULT_HICACHE_RATIO, budget * (1 - AUTO_SIZE_SLACK) / device_pool_bytes)


def host_pool_bytes_per_rank(
    levers: Mapping[str, Any], gpu_total_bytes: int, host_available_bytes: int | None = None
) -> int:
    """Pinned host memory one rank's hierarchical cache takes (0 when it is off).

    ``hicache_size`` is decimal GB per rank. Else ``hicache_ratio`` × the device KV
    pool, which is at most ``mem_fraction_static`` × the GPU's memory (an upper bound:
    the weights come out of that fraction too). Auto-sized (neither set): that bound at
    ratio 2.0, limited to SGLang's share of ``host_available_bytes`` when given.
    """
    if not lever_bool(levers, "enable_hierarchical_cache"):
        return 0
    size = lever_int(levers, "hicache_size") or 0
    if size > 0:
        return size * GB
    fraction = lever_float(levers, "mem_fraction_static") or 0.9
    device = int(fraction * gpu_total_bytes)
    ratio = lever_float(levers, "hicache_ratio")
    if ratio is not None:
        return int(ratio * device)
    if host_available_bytes is None:
        return int(DEFAULT_HICACHE_RATIO * device)
    ranks = Layout.of(levers).ranks
    return max(0, int(auto_ratio(device, host_available_bytes, ranks) * device))


def held_host_bytes(
    levers: Mapping[str, Any], gpu_total_bytes: int, host_available_now_bytes: int
) -> int:
    """Pinned host RAM a *running* server's hierarchical cache holds over all its ranks
    (what it frees when it stops), ``host_available_now_bytes`` being measured with it in
    place.

    Explicit ``hicache_size`` / ``hicache_ratio``: as ``host_pool_bytes_per_rank``. Auto-
    sized: SGLang took ``hicache_host_memory_fraction`` of what was available at the
    server's start (``mem_cache/hicache_auto_size.py:96-97``,
    ``mem_cache/pool_host/base.py:84-108``) — what is available now plus what the pool
    took, so the held bytes are the fixed point ``P = ranks × per_rank(now + P)`` (a
    contraction: each step changes by 0.76× the last). Assumes nothing else took or gave
    back host RAM since; more than that is never assumed (not ratio 2.0).
    """
    ranks = Layout.of(levers).ranks
    if not auto_sized(levers):
        return ranks * host_pool_bytes_per_rank(levers, gpu_total_bytes)
    held = 0
    for _ in range(200):
        step = ranks * host_pool_bytes_per_rank(
            levers, gpu_total_bytes, host_available_now_bytes + held
        )
        if abs(step - held) < 1 << 20:
            return step
        held = step
    return held


def host_pool_tokens(
    hicache_size_gb: int,
    hicache_ratio: float | None,
    device_tokens: int,
    cell: float,
    page_size: int = 1,
) -> int:
    """Tokens one rank's host pool holds: ``hicache_size × 1e9 // cell`` when a size is
    given (it overrides the ratio), else ``ratio × device tokens`` (ratio 2.0 by default);
    then whole pages and SGLang's padding page (``page_num = size // page + 1``,
    ``mem_cache/pool_host/base.py:221-229``)."""
    if hicache_size_gb > 0:
        size = int(hicache_size_gb * GB // cell)
    else:
        ratio = DEFAULT_HICACHE_RATIO if hicache_ratio is None else hicache_ratio
        size = int(device_tokens * ratio)
    page = max(1, page_size)
    return (size // page + 1) * page


# --- the host's available RAM, as SGLang bounds it ------------------------------------


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text == "max" else int(text)


def cgroup_headroom_bytes(
    proc: Path = Path("/proc"), root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """The process's cgroup v2 memory headroom: the least of ``memory.max`` (and
    ``memory.high``) − (``memory.current`` − file page cache) over its cgroup and the
    ancestors; None without a limit or on cgroup v1 (SGLang's rule, simplified)."""
    try:
        lines = (proc / "self/cgroup").read_text().splitlines()
    except OSError:
        return None
    rel = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
    if rel is None:
        return None
    directory = root / rel.lstrip("/")
    headroom: int | None = None
    while True:
        for name in ("memory.max", "memory.high"):
            limit = _read_int(directory / name)
            if limit is None:
                continue
            usage = _read_int(directory / "memory.current") or 0
            cache = 0
            with contextlib.suppress(OSError, ValueError):
                stat = dict(
                    line.split() for line in (directory / "memory.stat").read_text().splitlines()
                )
                cache = int(stat.get("active_file", 0)) + int(stat.get("inactive_file", 0))
            left = max(0, limit - max(0, usage - cache))
            headroom = left if headroom is None else min(headroom, left)
        if directory == root or root not in directory.parents:
            break
        directory = directory.parent
    return headroom


def available_host_ram_bytes() -> tuple[int, str]:
    """(bytes, where from): psutil's available RAM bounded by the cgroup headroom."""
    available = int(psutil.virtual_memory().available)
    try:
        headroom = cgroup_headroom_bytes()
    except (OSError, ValueError):
        headroom = None
    if headroom is not None and headroom < available:
        return headroom, "cgroup"
    return available, "host"
