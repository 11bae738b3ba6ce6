"""Units of memory, and one way to print each.

GPU memory, NVML figures and host RAM are binary (``GiB``); SGLang's ``hicache_size`` and
the planner's per-rank host budgets are decimal gigabytes (``GB``), as SGLang reads them.
Every module imports these instead of keeping its own ``1 << 30``.
"""

from __future__ import annotations

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
#: Decimal gigabyte: SGLang's ``--hicache-size`` is in these.
GB = 1_000_000_000


def fmt_gib(n: float | None, digits: int = 1, *, grouping: bool = False) -> str:
    """``n`` bytes as binary gigabytes: ``fmt_gib(3 << 30)`` -> ``"3.0 GiB"``; ``-`` for None."""
    if n is None:
        return "-"
    sep = "," if grouping else ""
    return f"{n / GiB:{sep}.{digits}f} GiB"


def fmt_gb(n: float | None, digits: int = 1, *, grouping: bool = False) -> str:
    """``n`` bytes as decimal gigabytes: ``fmt_gb(2e9)`` -> ``"2.0 GB"``; ``-`` for None."""
    if n is None:
        return "-"
    sep = "," if grouping else ""
    return f"{n / GB:{sep}.{digits}f} GB"


def fmt_mib(n: float | None, digits: int = 0) -> str:
    """``n`` bytes as mebibytes: ``fmt_mib(5 << 20)`` -> ``"5 MiB"``; ``-`` for None."""
    if n is None:
        return "-"
    return f"{n / MiB:.{digits}f} MiB"
