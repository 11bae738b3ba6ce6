"""The measured effect's verdict (``observe.effect.judge``) from two windows of the load
history: comparable load first (the arrival rate), then throughput, then the wait."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sglang_supervisor.observe.effect import Margins, judge, settle_s, window
from sglang_supervisor.observe.history import Sample

M = Margins(margin=0.10, load_margin=0.20)


def figures(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "samples": 10,
        "generation_throughput_tps": 1000.0,
        "running_requests": 50.0,
        "queued_requests": 0.0,
        "token_usage": 0.5,
        "ttft_s": 0.2,
        "itl_s": 0.02,
        "cache_hit_rate": 0.3,
        "arrival_rate_rps": 5.0,
    }
    return {**base, **kw}


@pytest.mark.parametrize(
    ("after", "verdict", "said"),
    [
        ({}, "unchanged", "no figure moved by more than ±10%"),
        ({"generation_throughput_tps": 1500.0}, "better", "throughput 1,000 → 1,500 tok/s (+50%)"),
        ({"generation_throughput_tps": 500.0, "ttft_s": 0.1}, "worse", "throughput 1,000 → 500"),
        # Throughput leads: more work done wins over a longer wait, and the reverse.
        ({"generation_throughput_tps": 1300.0, "itl_s": 0.03}, "better", "ITL 0.020 → 0.030 s"),
        # Throughput unchanged: the wait decides.
        ({"queued_requests": 40.0, "ttft_s": 3.0}, "worse", "queued 0.0 → 40.0 (+4000%)"),
        ({"ttft_s": 0.1}, "better", "TTFT 0.200 → 0.100 s (-50%)"),
        ({"ttft_s": 0.1, "itl_s": 0.03}, "mixed", "TTFT"),
        # A queue within one request, a 5 % move: noise.
        ({"queued_requests": 0.6, "generation_throughput_tps": 1050.0}, "unchanged", ""),
        ({"arrival_rate_rps": 6.5}, "load changed", "arrivals 5.00 → 6.50/s, +30%"),
        ({"arrival_rate_rps": 5.9, "generation_throughput_tps": 500.0}, "worse", "5.00 → 5.90"),
    ],
)
def test_the_verdict_and_the_figures_behind_it(
    after: dict[str, Any], verdict: str, said: str
) -> None:
    got, detail, changes = judge(figures(), figures(**after), M)
    assert got == verdict, detail
    assert said in detail
    if verdict not in ("load changed",):
        assert "generation_throughput_tps" in changes


def test_a_figure_from_nothing_is_said_not_stored_as_infinity() -> None:
    verdict, detail, changes = judge(figures(ttft_s=0.0), figures(ttft_s=0.5), M)
    assert verdict == "worse" and "TTFT 0.000 → 0.500 s (new)" in detail
    assert "ttft_s" not in changes and json.dumps(changes, allow_nan=False)


def test_nothing_to_compare() -> None:
    idle = {"arrival_rate_rps": 0.0, "generation_throughput_tps": 0.0}
    assert judge(figures(**idle), figures(**idle), M)[0] == "no load"
    # Load where there was none is a change of load, not an improvement.
    assert judge(figures(**idle), figures(), M)[0] == "load changed"
    verdict, detail, _ = judge(figures(samples=1), figures(), M)
    assert verdict == "not measured" and "1 readings before the change" in detail
    verdict, detail, _ = judge(figures(arrival_rate_rps=None), figures(), M)
    assert verdict == "not measured" and "sglang:num_requests_total" in detail


def test_the_after_window_waits_for_the_new_server_to_fill() -> None:
    # Little's law: 50 running over 5 arrivals a second: a request spends 10 s inside.
    assert settle_s(figures(), 60.0) == 10.0
    assert settle_s(figures(queued_requests=250.0), 60.0) == 60.0  # at most a window
    assert settle_s(figures(arrival_rate_rps=0.0), 60.0) == 0.0


def test_a_window_is_the_mean_of_its_samples() -> None:
    def s(t: float, tput: float | None, queued: float) -> Sample:
        return Sample(t, 10.0, queued, None, 0.3, tput, 0.5, 0.02, 4.0)

    samples = (s(100, 900, 0), s(102, 1000, 2), s(104, None, 4), s(106, 1100, 6), s(108, 5, 9))
    w = window(samples, 101.0, 106.0)  # (101, 106]: the samples at 102, 104, 106
    assert w["samples"] == 2  # readings with a throughput
    assert w["generation_throughput_tps"] == 1050.0
    assert w["queued_requests"] == 4.0 and w["ttft_s"] is None
    assert w["arrival_rate_rps"] == 4.0 and w["seconds"] == 5.0
