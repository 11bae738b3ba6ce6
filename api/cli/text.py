"""Text primitives of the CLI's output: widths, clipping, sizes, durations, values, clocks,
tables. ASCII only; pure functions."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sglang_supervisor.units import fmt_gib


def terminal_width(default: int = 100) -> int:
    """The terminal's width (``default`` when not a terminal), at least 60."""
    return max(60, shutil.get_terminal_size((default, 24)).columns)


def clip(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with ``...`` when longer."""
    text = text.replace("\n", " ").replace("\r", " ")
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


def gib(n: int | float | None) -> str:
    """Bytes as GiB with one decimal (``-`` when unknown)."""
    return fmt_gib(n)


def duration(seconds: float | None) -> str:
    """``0.42s``, ``12.3s``, ``4m05s``, ``2h03m``, ``3d04h``."""
    if seconds is None:
        return "-"
    s = float(seconds)
    if s < 10:
        return f"{s:.2f}s"
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def value(v: Any) -> str:
    """A lever value as an operator would type it (``-`` when unset)."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return " ".join(value(x) for x in v)
    return str(v)


def clock(iso: str | None) -> str:
    """An ISO timestamp from the daemon as local ``YYYY-MM-DD HH:MM:SS``."""
    if not iso:
        return "-"
    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return iso


def epoch_clock(ts: float | None) -> str:
    """A Unix time as local ``HH:MM:SS.mmm``."""
    t = time.time() if ts is None else float(ts)
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


def table(
    rows: Sequence[Sequence[str]], header: Sequence[str] | None = None, indent: int = 0
) -> str:
    """Left-aligned columns separated by two spaces; trailing spaces removed."""
    all_rows = [list(header)] if header else []
    all_rows += [list(r) for r in rows]
    if not all_rows:
        return ""
    ncol = max(len(r) for r in all_rows)
    for r in all_rows:
        r += [""] * (ncol - len(r))
    widths = [max(len(r[i]) for r in all_rows) for i in range(ncol)]
    pad = " " * indent
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in all_rows]
    return "\n".join(pad + line.rstrip() for line in lines)
