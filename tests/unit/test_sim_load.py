"""The simulated engine under its synthetic load, driven by a fake clock: admission is
bounded by KV tokens and max_running, the rest queue; fp8's smaller cell lets more run;
the host cache raises the hit rate, not the running count."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sglang_supervisor import planner
from sglang_supervisor.planner import PlanError
from sglang_supervisor.sim import capacity
from sglang_supervisor.sim.faults import Faults, parse_faults
from sglang_supervisor.sim.load import Engine, LoadSpec, parse_load

H200 = 143771 * 2**20


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run(engine: Engine, seconds: float, step: float = 0.1, start: float = 0.0) -> float:
    """Tick ``engine`` every ``step`` fake seconds; returns the end time."""
    t = start
    while t < start + seconds:
        t += step
        engine.tick(t)
    return t


def pool(fraction: float, dtype: str = "auto", tp: int = 8) -> int:
    levers = {"tp_size": tp, "mem_fraction_static": fraction, "kv_cache_dtype": dtype}
    return planner.pool_tokens(capacity.SIM_MODEL, levers, H200)


def test_parse_load() -> None:
    assert parse_load("") is None
    spec = parse_load(" rate=30, avg_tokens=32000 ,seed=7")
    assert spec == LoadSpec(rate=30.0, avg_tokens=32000, seed=7)
    with pytest.raises(ValueError, match="lacks avg_tokens"):
        parse_load("rate=3")
    with pytest.raises(ValueError, match=r"rate='9000' must be a number in \[0.001, 2000\]"):
        parse_load("rate=9000,avg_tokens=10")
    with pytest.raises(ValueError, match="'burst=3' is not one of"):
        parse_load("rate=1,avg_tokens=10,burst=3")
    with pytest.raises(ValueError, match=r"avg_tokens='1\.5' must be an integer"):
        parse_load("rate=1,avg_tokens=1.5")
    with pytest.raises(ValueError, match=r"rate='fast' must be a number"):
        parse_load("rate=fast,avg_tokens=10")


def test_env_lists_allow_spaces_around_names_and_values() -> None:
    assert parse_load("rate = 2 , avg_tokens = 64,") == LoadSpec(rate=2.0, avg_tokens=64)
    faults = parse_faults(" crash_after = 1.5 , detach_ranks ")
    assert faults == Faults(crash_after=1.5, detach_ranks=True)
    with pytest.raises(ValueError, match="'crash_after=soon' needs a number of seconds"):
        parse_faults("crash_after=soon")


def test_kv_bounds_running_and_the_rest_queue() -> None:
    tokens = pool(0.85)
    load = LoadSpec(rate=30, avg_tokens=32000)
    e = Engine(tokens, 1024, load=load, decode_graph_max_bs=512)
    run(e, 20)
    s = e.stats()
    # ~84 requests of ~32k fit 2.7M tokens; the pool is full and a queue builds.
    assert 60 <= s.running <= 110
    assert s.tokens <= tokens and s.token_usage > 0.9
    assert s.queued > 50
    # Each decode step gives every running request a token (10 ms a step); the prefill
    # passes between them, and the retractions a full pool forces, take the rest.
    assert 0.3 * s.running * 100 < s.gen_throughput < s.running * 100
    assert s.retracted_total > 0
    assert s.generation_tokens_total > 0 and s.prompt_tokens_total > 0


def test_max_running_requests_also_bounds() -> None:
    e = Engine(pool(0.85), 10, load=LoadSpec(rate=30, avg_tokens=32000))
    run(e, 10)
    s = e.stats()
    assert s.running == 10 and s.queued > 0 and s.token_usage < 0.2


def test_more_kv_runs_more_and_queues_less() -> None:
    load = LoadSpec(rate=30, avg_tokens=32000)
    before = Engine(pool(0.85), 1024, load=load)
    after = Engine(pool(0.928, "fp8_e4m3"), 1024, load=load)
    run(before, 30)
    run(after, 30)
    b, a = before.stats(), after.stats()
    assert pool(0.928, "fp8_e4m3") > 2 * pool(0.85)
    assert a.running > 1.3 * b.running
    assert a.queued < b.queued / 10
    assert a.generation_tokens_total > b.generation_tokens_total


def test_host_cache_raises_hit_rate_not_running() -> None:
    load = LoadSpec(rate=30, avg_tokens=32000)
    tokens = pool(0.85)
    host = planner.host_pool_tokens(246, None, tokens, 40_960)
    plain = Engine(tokens, 1024, load=load)
    hicache = Engine(tokens, 1024, load=load, host_cache_tokens=host)
    run(plain, 60)
    run(hicache, 60)
    p, h = plain.stats(), hicache.stats()
    assert h.cache_hit_rate > p.cache_hit_rate + 0.05
    assert abs(h.running - p.running) <= 0.15 * p.running


def test_same_seed_same_run_and_cuda_graph_flag() -> None:
    load = LoadSpec(rate=50, avg_tokens=8000, seed=3)
    a = Engine(pool(0.85), 1024, load=load, decode_graph_max_bs=64)
    b = Engine(pool(0.85), 1024, load=load, decode_graph_max_bs=64)
    run(a, 15)
    run(b, 15)
    assert a.stats() == b.stats()
    assert a.stats().running > 64 and a.stats().cuda_graph is False


def test_queue_is_bounded_and_a_stall_is_not_replayed() -> None:
    e = Engine(pool(0.85), 4, load=LoadSpec(rate=1000, avg_tokens=1000, max_queue=100))
    run(e, 2)
    assert e.stats().queued == 100 and e.stats().turned_away_total > 1000
    e.tick(1000.0)  # a long stall: at most a couple of seconds of arrivals are replayed
    assert e.stats().turned_away_total < 2000 + 3000


def test_close_aborts_synthetic_requests_only() -> None:
    e = Engine(pool(0.85), 1024, load=LoadSpec(rate=30, avg_tokens=32000))
    run(e, 10)
    assert e.stats().running > 0
    aborted = e.close()
    s = e.stats()
    assert aborted > 0 and s.running == 0 and s.queued == 0 and s.tokens == 0
    assert e.inflight() == 0 and e.wait_idle(0.1)
    run(e, 5, start=10)  # no more arrivals once closed
    assert e.stats().running == 0
    assert e.generate("late", 1, 1) is None


def test_real_requests_share_the_fifo_with_synthetic_ones() -> None:
    e = Engine(1000, 1024)
    r = e.generate("hello " * 8, 10, 1)
    assert r is not None and r.cached_tokens == 0
    r = e.generate("hello " * 8, 10, 1)
    assert r is not None and r.cached_tokens == 10  # the whole prompt is cached
    assert e.stats().prompt_tokens_total == 20 and e.stats().generation_tokens_total == 2


def test_ticking_is_cheap() -> None:
    e = Engine(pool(0.85), 1024, load=LoadSpec(rate=200, avg_tokens=32000))
    t0 = time.process_time()
    run(e, 120)  # two simulated minutes at 200 requests/s, ticked every 0.1 s
    assert time.process_time() - t0 < 1.0


def test_the_simulated_model_follows_model_path_then_the_env(tmp_path: Path) -> None:
    cfg = {
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 8192,
        "intermediate_size": 29568,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 152064,
    }
    path = tmp_path / "q" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    env = {capacity.MODEL_CONFIG_ENV: str(path)}
    assert capacity.resolve_model("meta-llama/x", {}) is capacity.SIM_MODEL
    by_env = capacity.resolve_model("meta-llama/x", env)
    assert by_env.architecture == "Qwen2ForCausalLM"
    assert by_env.weight_source.startswith("estimated from config.json")
    # A local model directory wins, as real SGLang would load it.
    model_dir = tmp_path / "llama"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 32}))
    assert capacity.resolve_model(str(model_dir), env).shape.num_layers == 32
    path.write_text("{")
    with pytest.raises(PlanError, match="not valid JSON"):
        capacity.resolve_model("meta-llama/x", env)


def test_dp_workers_each_have_their_own_pool_and_share_of_requests() -> None:
    # 4 DP workers of 100k tokens and 3 requests each, fed round robin: 12 run, each
    # worker's pool fills on its own, the rest queue on their workers.
    load = LoadSpec(rate=100, avg_tokens=20000, out_tokens=5000)
    e = Engine(100_000, 3, workers=4, load=load)
    run(e, 5)
    parts = e.worker_stats()
    assert len(parts) == 4
    assert all(p.running == 3 and p.queued > 0 for p in parts)
    assert all(p.tokens <= 100_000 for p in parts)
    s = e.stats()
    assert s.running == 12 and s.queued == sum(p.queued for p in parts)
    assert s.tokens == sum(p.tokens for p in parts)


def test_a_prefill_over_the_activation_limit_stops_admission() -> None:
    clock = FakeClock()
    e = Engine(100_000, 8, prefill_batch_tokens=8192, prefill_limit_tokens=900, clock=clock)
    r = e.submit("short", 800, 1)
    assert r is not None and r.admitted and e.prefill_oom is None
    clock.now += 1.0
    e.finish(r)
    big = e.submit("long", 2000, 1)
    assert big is not None and not big.admitted and e.prefill_oom == 2000
    # A prompt longer than the chunk prefills a chunk at a time.
    e2 = Engine(100_000, 8, prefill_batch_tokens=8192, prefill_limit_tokens=8192)
    huge = e2.submit("huge", 30_000, 1)
    assert huge is not None and huge.admitted and e2.prefill_oom is None


def test_live_average_over_dp_workers_reads_every_pool() -> None:
    # What the planner measures from a server with 4 DP workers' series (the supervisor's
    # telemetry sums running requests and keeps the fullest pool's usage).
    from sglang_supervisor.observe.telemetry import parse_metrics
    from sglang_supervisor.planner import LiveLoad
    from sglang_supervisor.sim import metrics

    load = LoadSpec(rate=100, avg_tokens=20000, out_tokens=5000)
    e = Engine(100_000, 3, workers=4, load=load)
    run(e, 5)
    t = parse_metrics(metrics.render(metrics.registry_for(e, "m", ranks=8)).decode())
    s = e.stats()
    assert t.running_requests == s.running == 12 and t.queued_requests == s.queued
    assert t.used_tokens == s.tokens
    live = LiveLoad(
        running_requests=t.running_requests,
        token_usage=t.token_usage,
        max_total_num_tokens=e.max_total_num_tokens,
        used_tokens=t.used_tokens,
        kv_pools=4,
    )
    assert live.avg_tokens() == round(s.tokens / 12)
    # Without the used tokens: the fullest pool's usage × the 4 pools, an over-estimate
    # (the pools hold what admission let in, unevenly), within a half.
    rough = LiveLoad(
        running_requests=12,
        token_usage=t.token_usage,
        max_total_num_tokens=e.max_total_num_tokens,
        kv_pools=4,
    ).avg_tokens()
    assert rough is not None and s.tokens / 12 <= rough < 1.5 * s.tokens / 12
