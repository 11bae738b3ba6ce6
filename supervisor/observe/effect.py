"""The measured effect of a change: the server over a window after it, beside the same
window before it, from the load history the daemon keeps (``observe.history``).

Each window's figures are the means of its samples (one per telemetry read, 2 s):
``generation_throughput_tps`` (``sglang:gen_throughput``), ``running_requests``,
``queued_requests``, ``token_usage``, ``ttft_s`` and ``itl_s`` (SGLang's time-to-first-
token and inter-token-latency histograms), ``cache_hit_rate`` and ``arrival_rate_rps``,
the offered load. The verdict (``judge``), in this order:

* ``not measured`` — fewer than ``MIN_SAMPLES`` readings in a window, or no arrival rate
  (the server exports no ``sglang:num_requests_total``): nothing can be compared;
* ``no load`` — under ``NO_LOAD_RPS`` requests a second before and after;
* ``load changed`` — the arrival rate moved by more than ``load_margin`` of what it was:
  the figures are not comparable;
* under comparable load, generation throughput decides when it moved by more than
  ``margin`` (``better``, ``worse``); when it did not, the queue, the time to first token
  and the inter-token latency do: ``worse`` (one of them rose by more than ``margin``,
  none fell), ``better`` (the reverse), ``mixed`` (both), else ``unchanged``;
* ``interrupted`` — another operation, a crash or the daemon's exit ended the window
  early (the figures cover what it saw); ``measuring`` while the window is open.

The after-window begins once the new server has had time to fill: a restarted server
starts with nothing running, and under the same arrivals it reaches its steady state
after about the time a request spent in the server before the change — by Little's law,
what ran and waited over the arrival rate (``settle_s``, at most one window). Without
that, any restart would look like lost throughput for one request's lifetime.

``EffectMeter`` holds the one measurement in progress (an apply that committed without
the guard), the last effect judged and a count per verdict: bounded whatever the uptime.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sglang_supervisor.observe.history import Sample
from sglang_supervisor.operations import Operation, wall_iso

#: (figure in ``before``/``after``, the history's column, +1 higher is better, -1 lower
#: is better, 0 shown but not judged).
FIGURES: tuple[tuple[str, str, int], ...] = (
    ("generation_throughput_tps", "gen_tokens_per_s", +1),
    ("running_requests", "running_requests", 0),
    ("queued_requests", "queued_requests", -1),
    ("token_usage", "token_usage", 0),
    ("ttft_s", "ttft_s", -1),
    ("itl_s", "itl_s", -1),
    ("cache_hit_rate", "cache_hit_rate", 0),
    ("arrival_rate_rps", "arrivals_per_s", 0),
)
#: Every verdict, for the metrics' bounded label.
VERDICTS = (
    "measuring",
    "better",
    "worse",
    "mixed",
    "unchanged",
    "load changed",
    "no load",
    "not measured",
    "interrupted",
)
#: Readings a window needs before it is compared.
MIN_SAMPLES = 2
#: Below this many arrivals a second there is no load to speak of.
NO_LOAD_RPS = 0.05
#: A change in the queue counts only from this many requests (0 -> 0.5 is noise).
MIN_QUEUE_CHANGE = 1.0
#: A throughput below this (tokens/s) is not compared as a ratio.
MIN_THROUGHPUT = 1.0
_UNITS = {
    "generation_throughput_tps": ("throughput", "tok/s"),
    "queued_requests": ("queued", ""),
    "ttft_s": ("TTFT", "s"),
    "itl_s": ("ITL", "s"),
}


@dataclass(frozen=True)
class Margins:
    """How much a figure must move to count (``margin``), and how far the arrival rate
    may move for the windows to be comparable (``load_margin``), both relative."""

    margin: float = 0.10
    load_margin: float = 0.20


def window(samples: Sequence[Sample], start: float, end: float) -> dict[str, Any]:
    """The figures of the samples taken in ``(start, end]`` (Unix times)."""
    times = [s.t for s in samples]
    chosen = samples[bisect.bisect_right(times, start) : bisect.bisect_right(times, end)]
    out: dict[str, Any] = {
        "from": wall_iso(start),
        "until": wall_iso(end),
        "seconds": round(max(0.0, end - start), 1),
        "samples": sum(1 for s in chosen if s.gen_tokens_per_s is not None),
    }
    for name, column, _ in FIGURES:
        values = [v for s in chosen if (v := getattr(s, column)) is not None]
        out[name] = round(sum(values) / len(values), 4) if values else None
    return out


def settle_s(before: dict[str, Any], window_s: float) -> float:
    """How long the new server fills before its window: the mean time a request spent
    in the server before the change (running + queued over arrivals), at most a window."""
    rate = before.get("arrival_rate_rps")
    if not rate or rate < NO_LOAD_RPS:
        return 0.0
    inside = (before.get("running_requests") or 0.0) + (before.get("queued_requests") or 0.0)
    return round(min(window_s, float(inside) / float(rate)), 1)


def _change(name: str, before: float | None, after: float | None) -> float | None:
    """The relative change of a figure, or None where it means nothing."""
    if before is None or after is None:
        return None
    if name == "queued_requests":
        if abs(after - before) < MIN_QUEUE_CHANGE:
            return 0.0
        return (after - before) / max(before, 1.0)
    if name == "generation_throughput_tps" and max(before, after) < MIN_THROUGHPUT:
        return 0.0
    if before <= 0:
        return None if after <= 0 else float("inf")
    return (after - before) / before


def _pct(change: float) -> str:
    return "new" if change == float("inf") else f"{change:+.0%}"


def _fmt(name: str, before: float, after: float, change: float) -> str:
    label, unit = _UNITS[name]
    digits = 0 if name == "generation_throughput_tps" else 1 if name == "queued_requests" else 3
    unit = f" {unit}" if unit else ""
    return f"{label} {before:,.{digits}f} → {after:,.{digits}f}{unit} ({_pct(change)})"


def judge(
    before: dict[str, Any], after: dict[str, Any], m: Margins
) -> tuple[str, str, dict[str, float]]:
    """The verdict, a sentence with the figures behind it, and each judged figure's
    relative change (see the module's docstring for the rules)."""
    if before["samples"] < MIN_SAMPLES or after["samples"] < MIN_SAMPLES:
        return (
            "not measured",
            f"{before['samples']} readings before the change and {after['samples']} after "
            f"(at least {MIN_SAMPLES} each are needed: the server had not served long "
            "enough, or its telemetry did not answer)",
            {},
        )
    rate_b, rate_a = before["arrival_rate_rps"], after["arrival_rate_rps"]
    if rate_b is None or rate_a is None:
        return (
            "not measured",
            "the offered load is unknown (the server exports no sglang:num_requests_total)",
            {},
        )
    load = f"arrivals {rate_b:.2f} → {rate_a:.2f}/s"
    if max(rate_b, rate_a) < NO_LOAD_RPS:
        return "no load", f"no load to compare ({load})", {}
    if rate_b < NO_LOAD_RPS or abs(rate_a - rate_b) > m.load_margin * rate_b:
        moved = "from none" if rate_b < NO_LOAD_RPS else _pct((rate_a - rate_b) / rate_b)
        return (
            "load changed",
            f"the offered load changed ({load}, {moved}; comparable within "
            f"±{m.load_margin:.0%}): the figures are not compared",
            {},
        )
    changes = {}
    for name, _, sign in FIGURES:
        if sign and (c := _change(name, before[name], after[name])) is not None:
            changes[name] = round(c, 4) if c != float("inf") else c
    worse: list[str] = []
    better: list[str] = []
    for name, c in changes.items():
        sign = next(s for n, _, s in FIGURES if n == name)
        if abs(c) > m.margin:
            (better if c * sign > 0 else worse).append(name)

    def said(names: list[str]) -> str:
        return ", ".join(_fmt(n, before[n], after[n], changes[n]) for n in names)

    lead = "generation_throughput_tps"
    if lead in worse or lead in better:
        verdict = "worse" if lead in worse else "better"
        shown = [lead] + [n for n in (worse + better) if n != lead]
    else:
        verdict = (
            "mixed"
            if worse and better
            else "worse"
            if worse
            else "better"
            if better
            else "unchanged"
        )
        shown = worse + better
    # JSON has no infinity: a figure that rose from nothing is said ("new"), not stored.
    stored = {n: c for n, c in changes.items() if c != float("inf")}
    if not shown:
        return verdict, f"no figure moved by more than ±{m.margin:.0%} ({load})", stored
    return verdict, f"{said(shown)}; under comparable load ({load})", stored


def effect_json(
    window_s: float,
    m: Margins,
    guard: bool,
    before: dict[str, Any],
    after: dict[str, Any] | None,
    verdict: str,
    detail: str,
    changes: dict[str, float] | None = None,
) -> dict[str, Any]:
    """What ``op.effect`` holds."""
    return {
        "window_s": window_s,
        "settle_s": settle_s(before, window_s),
        "verdict": verdict,
        "detail": detail,
        "guard": guard,
        "margin": m.margin,
        "load_margin": m.load_margin,
        "before": before,
        "after": after,
        "changes": changes or {},
    }


@dataclass
class Pending:
    """A measurement in progress: its operation, and where its after-window lies."""

    op: Operation
    after_from: float
    after_until: float
    window_s: float
    margins: Margins


class EffectMeter:
    """The measurement in progress (at most one), the last effect judged, the counts."""

    def __init__(self) -> None:
        self.pending: Pending | None = None
        #: The last operation whose effect was measured (or is being measured).
        self.last: Operation | None = None
        #: Effects judged, by verdict.
        self.counts: dict[str, int] = {}
        #: When the last operation other than the one measured ended (Unix time): a
        #: before-window never reaches back over it.
        self.last_op_end: float = 0.0

    def before_window(
        self, op: Operation, window_s: float, samples: Sequence[Sample]
    ) -> dict[str, Any]:
        """The window before ``op`` began, never reaching back over the last operation."""
        return window(samples, max(op.created_unix - window_s, self.last_op_end), op.created_unix)

    def begin(
        self,
        op: Operation,
        samples: Sequence[Sample],
        now: float,
        window_s: float,
        m: Margins,
    ) -> None:
        """``op`` committed: its before-window now, its after-window from ``now`` plus
        the time the new server needs to fill (``settle_s``)."""
        before = self.before_window(op, window_s, samples)
        start = now + settle_s(before, window_s)
        closes = wall_iso(start + window_s)
        op.effect = effect_json(
            window_s, m, False, before, None, "measuring", f"the window closes at {closes}"
        )
        self.pending = Pending(op, start, start + window_s, window_s, m)
        self.last = op

    def due(self, now: float) -> bool:
        return self.pending is not None and now >= self.pending.after_until

    def close(
        self, samples: Sequence[Sample], now: float, why: str | None = None
    ) -> Operation | None:
        """End the measurement in progress: judged when its window is over, else
        ``interrupted`` saying ``why`` (the figures cover what it saw)."""
        p = self.pending
        if p is None:
            return None
        self.pending = None
        end = max(p.after_from, min(now, p.after_until))
        after = window(samples, p.after_from, end)
        effect = dict(p.op.effect or {})
        if why is None:
            verdict, detail, changes = judge(effect["before"], after, p.margins)
        else:
            into = max(0.0, end - p.after_from)
            verdict, changes = "interrupted", {}
            detail = f"{why} {into:.0f} s into the {p.window_s:g} s window; not judged"
        effect.update(after=after, verdict=verdict, detail=detail, changes=changes)
        p.op.effect = effect
        self.judged(p.op)
        return p.op

    def judged(self, op: Operation) -> None:
        """Count ``op``'s final verdict (a guarded apply's, or one closed here)."""
        self.last = op
        verdict = (op.effect or {}).get("verdict", "not measured")
        self.counts[verdict] = self.counts.get(verdict, 0) + 1

    def operation_ended(self, op: Operation, samples: Sequence[Sample]) -> Operation | None:
        """Another operation ended (the registry's hook): it interrupts a measurement in
        progress (returned when it did), and later before-windows start after it."""
        closed = self.interrupt(samples, op)
        self.last_op_end = max(self.last_op_end, op.ended_unix or 0.0)
        return closed

    def interrupt(self, samples: Sequence[Sample], op: Operation) -> Operation | None:
        """``op`` began while a measurement was in progress: it ends there."""
        p = self.pending
        if p is None or op is p.op or op.dry_run:
            return None
        return self.close(samples, max(p.after_from, op.created_unix), why=interrupter(op))


def interrupter(op: Operation) -> str:
    """Why ``op`` ends a measurement, in words."""
    if op.kind == "recover":
        return f"the server crashed or hung ({op.rollback_reason or 'recover'}; operation {op.id})"
    return f"operation {op.id} ({op.kind}) began"
