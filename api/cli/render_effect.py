"""An apply's measured effect as text: one line (``operations``, the end of ``apply``) or
the window before beside the window after, figure by figure (``operations show``)."""

from __future__ import annotations

from typing import Any

from sglang_supervisor_api.cli.text import table

#: (figure, label, format) in the order ``operations show`` prints them.
FIGURES: tuple[tuple[str, str, str], ...] = (
    ("generation_throughput_tps", "throughput (tok/s)", "{:,.0f}"),
    ("running_requests", "running requests", "{:.1f}"),
    ("queued_requests", "queued requests", "{:.1f}"),
    ("token_usage", "token usage", "{:.3f}"),
    ("ttft_s", "time to first token (s)", "{:.3f}"),
    ("itl_s", "inter-token latency (s)", "{:.4f}"),
    ("cache_hit_rate", "cache hit rate", "{:.3f}"),
    ("arrival_rate_rps", "arrivals (requests/s)", "{:.2f}"),
)


def effect_summary(effect: Any) -> str:
    """``better: throughput 812 → 1,630 tok/s (+101%)...``; "-" without an effect."""
    if not isinstance(effect, dict):
        return "-"
    verdict = str(effect.get("verdict"))
    if verdict == "measuring":
        return f"measuring ({effect.get('window_s')} s window)"
    return f"{verdict}: {effect.get('detail') or ''}".rstrip(": ")


def effect_verdict(effect: Any) -> str:
    """The verdict alone (``load-changed``: one word for a table), "-" without one."""
    if not isinstance(effect, dict):
        return "-"
    return str(effect.get("verdict")).replace(" ", "-")


def effect_lines(effect: Any) -> list[str]:
    """The effect's verdict, what it says, and each figure before beside after."""
    if not isinstance(effect, dict):
        return []
    guard = " (the effect guard judged it)" if effect.get("guard") else ""
    lines = [f"  effect   {effect.get('verdict')}{guard}: {effect.get('detail') or ''}"]
    before = effect.get("before") or {}
    after = effect.get("after") or {}
    rows = []
    for key, label, fmt in FIGURES:
        b, a = before.get(key), after.get(key)
        if b is None and a is None:
            continue
        rows.append(
            [label, "-" if b is None else fmt.format(b), "-" if a is None else fmt.format(a)]
        )
    if rows:
        window = effect.get("window_s")
        heads = [f"over {window} s", "before", "after" if after else "after (measuring)"]
        lines += table(rows, heads, indent=4).splitlines()
    return lines
