"""/status's ``diagnosis`` (supervisor/planner/diagnosis.py) and the load history
(supervisor/observe/history.py): each kind from fake telemetry, the hold on a fake clock,
the alert's thresholds held to the rule's, and the history's bound."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from sglang_supervisor.observe.history import MAX_SAMPLES, LoadHistory, history_json
from sglang_supervisor.observe.telemetry import Throughput, parse_metrics
from sglang_supervisor.planner import LiveLoad
from sglang_supervisor.planner.diagnosis import (
    KV_BOUND_TOKEN_USAGE,
    QUEUE_LIMIT,
    Diagnoser,
    LoadKind,
    classify,
)

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"

KV_BOUND = Throughput(running_requests=80, queued_requests=240, token_usage=0.998)
QUEUED = Throughput(running_requests=48, queued_requests=30, token_usage=0.4)
CALM = Throughput(running_requests=20, queued_requests=0, token_usage=0.97)
NOTHING = Throughput()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def diagnoser(hold_s: float = 180.0) -> tuple[Diagnoser, Clock]:
    clock = Clock()
    # The wall clock runs 1.7e9 ahead of the monotonic one: since is a unix time.
    return Diagnoser(hold_s, clock=clock, wall=lambda: clock.now + 1.7e9), clock


def test_each_kind_from_the_gauges() -> None:
    assert classify(80, 240, 0.998) is LoadKind.KV_BOUND
    assert classify(48, 30, 0.4) is LoadKind.QUEUE_BOUND
    assert classify(20, 0, 0.97) is LoadKind.NOT_SATURATED
    # A short burst in the queue is not saturation, even with the cache full.
    assert classify(80, QUEUE_LIMIT, 0.99) is LoadKind.NOT_SATURATED
    assert classify(None, None, None) is LoadKind.NO_METRICS
    # The plan's sentence is the same rule's.
    assert LiveLoad(80, 240, 0.998).diagnosis().startswith("KV-cache bound: token usage 1.00")
    assert "not KV memory" in LiveLoad(48, 30, 0.4).diagnosis()
    assert LiveLoad(20, 0, 0.97).diagnosis().startswith("not saturated: 20 running, none")


def test_the_alert_and_the_diagnosis_share_their_thresholds() -> None:
    rules = yaml.safe_load(ALERTS.read_text())
    expr = next(
        r["expr"]
        for g in rules["groups"]
        for r in g["rules"]
        if r.get("alert") == "SglangKvCacheExhausted"
    )
    usage = re.search(r"server_token_usage_ratio > ([\d.]+)", expr)
    queued = re.search(r"server_queued_requests > (\d+)\n", expr)
    assert usage and float(usage[1]) == KV_BOUND_TOKEN_USAGE, expr
    assert queued and int(queued[1]) == QUEUE_LIMIT, expr


def test_a_kind_is_reported_only_after_it_held() -> None:
    d, clock = diagnoser(hold_s=180)
    assert d.current.kind is LoadKind.NO_METRICS
    d.observe(CALM)
    clock.now += 180
    d.observe(CALM)
    assert d.current.kind is LoadKind.NOT_SATURATED
    began = clock.now + 1.7e9 + 2
    clock.now += 2
    d.observe(KV_BOUND)
    clock.now += 179
    d.observe(KV_BOUND)
    # Seen for 179 s of a 180 s hold: still the old kind, the new one pending.
    assert d.current.kind is LoadKind.NOT_SATURATED
    assert d.current.evidence["pending"] == {"kind": "kv_bound", "since": round(began, 3)}
    clock.now += 1
    d.observe(KV_BOUND)
    now = d.current
    assert now.kind is LoadKind.KV_BOUND
    assert now.since == round(began, 3), "since: when the kind began, not when reported"
    assert now.evidence["queued_requests"] == 240 and now.evidence["token_usage"] == 0.998
    assert now.evidence["thresholds"] == {"token_usage_above": 0.95, "queued_above": 10}
    assert "KV-cache bound" in now.message and "POST /plan" in (now.proposal or "")
    as_json = now.to_json()
    assert as_json["kind"] == "kv_bound" and as_json["since"] == round(began, 3)
    # A dip shorter than the hold does not clear it, nor move its since.
    clock.now += 2
    d.observe(QUEUED)
    clock.now += 2
    d.observe(KV_BOUND)
    assert d.current.kind is LoadKind.KV_BOUND and d.current.since == round(began, 3)


def test_no_metrics_is_reported_at_once() -> None:
    d, clock = diagnoser(hold_s=180)
    d.observe(KV_BOUND)
    clock.now += 200
    d.observe(KV_BOUND)
    assert d.current.kind is LoadKind.KV_BOUND
    clock.now += 2
    d.observe(NOTHING)  # the server is gone: it is not KV-bound any more
    assert d.current.kind is LoadKind.NO_METRICS and d.current.proposal is None


def test_a_zero_hold_reports_at_once() -> None:
    d, _ = diagnoser(hold_s=0)
    d.observe(QUEUED)
    assert d.current.kind is LoadKind.QUEUE_BOUND


def test_the_history_never_exceeds_its_maximum() -> None:
    h = LoadHistory(max_samples=5, wall=iter(range(100)).__next__)
    for i in range(12):
        h.record(Throughput(running_requests=i, queued_requests=0, token_usage=0.5))
        assert len(h.samples) <= 5
    assert [s.running_requests for s in h.samples] == [7, 8, 9, 10, 11]
    assert MAX_SAMPLES == 1800  # an hour at the 2 s telemetry interval
    body = history_json(h.samples, 2.0, 5)
    assert body["running_requests"] == [7, 8, 9, 10, 11] and body["t"] == [7, 8, 9, 10, 11]
    assert body["max_samples"] == 5 and body["columns"][0] == "t"


def test_a_reading_recorded_already_is_a_gap() -> None:
    h = LoadHistory(wall=lambda: 0.0)
    read = Throughput(running_requests=30, queued_requests=90, token_usage=0.99)
    h.record(read)
    h.record(read)  # no new reading since (an apply's old figures, a slow scrape)
    assert [s.queued_requests for s in h.samples] == [90, None]


def test_ttft_is_the_mean_of_each_interval_from_sglangs_histogram() -> None:
    text = """# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{{is_streaming="true",le="+Inf"}} {n1}
sglang:time_to_first_token_seconds_sum{{is_streaming="true"}} {s1}
sglang:time_to_first_token_seconds_count{{is_streaming="true"}} {n1}
sglang:time_to_first_token_seconds_bucket{{is_streaming="false",le="+Inf"}} {n2}
sglang:time_to_first_token_seconds_sum{{is_streaming="false"}} {s2}
sglang:time_to_first_token_seconds_count{{is_streaming="false"}} {n2}
"""
    h = LoadHistory(wall=lambda: 0.0)
    h.record(parse_metrics(text.format(n1=10, s1=5.0, n2=0, s2=0.0)))
    h.record(parse_metrics(text.format(n1=14, s1=9.0, n2=4, s2=12.0)))
    h.record(parse_metrics(text.format(n1=14, s1=9.0, n2=4, s2=12.0)))
    # The first has nothing before it; then (4 + 12) s over 8 requests; then none new.
    assert [s.ttft_s for s in h.samples] == [None, 2.0, None]
    # A new server's counters start again: no negative mean.
    h.record(parse_metrics(text.format(n1=1, s1=0.5, n2=0, s2=0.0)))
    assert h.samples[-1].ttft_s is None


def test_the_simulator_exports_sglangs_ttft_histogram() -> None:
    from sglang_supervisor.sim.load import Engine, parse_load
    from sglang_supervisor.sim.metrics import registry_for, render

    clock = Clock()
    engine = Engine(100_000, 10, load=parse_load("rate=20,avg_tokens=20000"), clock=clock)
    for _ in range(50):
        clock.now += 0.1
        engine.tick()
    t = parse_metrics(render(registry_for(engine, "m")).decode())
    assert t.ttft_count and t.ttft_count > 0
    assert t.ttft_seconds_sum and t.ttft_seconds_sum / t.ttft_count > 0
