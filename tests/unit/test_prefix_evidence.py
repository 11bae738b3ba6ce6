"""The host cache's evidence is the server's own metrics, under SGLang 0.5.23's names: the
simulated server's radix cache counts what it evicts (``sglang:evicted_tokens_total``,
``srt/observability/metrics_collector.py:2534-2541``; every rank exports its own copy,
``radix_cache_metric_labels`` :2414-2432) and what it serves from each tier
(``sglang:cached_tokens_total{cache_source}``, :1934-1938); the telemetry reads them; the
rule (``planner.prefixcache``) supports a host cache only for reused prefixes lost to
eviction. Unique prompts evict as much as shared ones: the hit rate decides, not the knob.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from sglang_supervisor import planner
from sglang_supervisor.observe.telemetry import parse_metrics
from sglang_supervisor.planner.prefixcache import PrefixWindow, host_cache_verdict
from sglang_supervisor.sim import capacity, metrics
from sglang_supervisor.sim.load import Engine, LoadSpec

H200 = 143771 * 2**20
RANKS = 8


def kv_bound_engine(prefix_share: float, host_tokens: int = 0, workers: int = 1) -> Engine:
    levers = {"tp_size": RANKS, "mem_fraction_static": 0.85}
    tokens = planner.pool_tokens(capacity.SIM_MODEL, levers, H200)
    load = LoadSpec(rate=30, avg_tokens=32000, prefix_share=prefix_share, seed=2)
    return Engine(tokens, 1024, workers=workers, load=load, host_cache_tokens=host_tokens)


def scrape(engine: Engine, seconds: float) -> PrefixWindow:
    """Run ``engine`` on a fake clock, reading its /metrics every 2 s as the daemon does."""
    now = [0.0]
    window = PrefixWindow(clock=lambda: now[0])
    registry = metrics.registry_for(engine, "m", RANKS)
    while now[0] < seconds:
        for _ in range(20):
            now[0] += 0.1
            engine.tick(now[0])
        window.observe(parse_metrics(metrics.render(registry).decode()))
    return window


def test_unique_prompts_evict_as_much_but_get_no_host_cache() -> None:
    evidence = scrape(kv_bound_engine(prefix_share=0.0), 60).evidence()
    assert evidence is not None
    assert evidence.hit_rate == 0
    # Every finished request's KV was cached, then evicted: nearly a token per prompt token.
    assert evidence.evicted_per_prompt_token is not None
    assert evidence.evicted_per_prompt_token > 0.5
    verdict = host_cache_verdict(evidence)
    assert not verdict.supported
    assert "share no prefixes" in verdict.reason


def test_shared_prefixes_lost_to_eviction_support_a_host_cache() -> None:
    evidence = scrape(kv_bound_engine(prefix_share=0.5), 60).evidence()
    assert evidence is not None
    assert evidence.hit_rate is not None and 0.15 < evidence.hit_rate < 0.5
    assert evidence.evicted_per_prompt_token is not None
    assert evidence.evicted_per_prompt_token > 0.5
    assert evidence.hit_rate_source.startswith("sglang:cached_tokens_total")
    verdict = host_cache_verdict(evidence)
    assert verdict.supported, verdict.reason
    assert "cache hit rate 0." in verdict.reason and "sglang:evicted_tokens_total" in verdict.reason


def test_the_host_tier_serves_prefixes_back_and_says_so() -> None:
    tokens = kv_bound_engine(0.5).max_total_num_tokens
    host = planner.host_pool_tokens(246, None, tokens, 40_960)
    engine = kv_bound_engine(0.5, host_tokens=host)
    evidence = scrape(engine, 60).evidence()
    assert evidence is not None and evidence.host_pool_tokens == host
    assert evidence.load_back_tokens_per_s is not None and evidence.load_back_tokens_per_s > 0
    text = metrics.render(metrics.registry_for(engine, "m", RANKS)).decode()
    sources = {
        s.labels["cache_source"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "sglang:cached_tokens"
        for s in f.samples
    }
    assert sources["host"] > 0 and sources["device"] > 0
    plain = scrape(kv_bound_engine(0.5), 60).evidence()
    assert plain is not None and plain.hit_rate is not None and evidence.hit_rate is not None
    assert evidence.hit_rate > plain.hit_rate + 0.05


def test_every_rank_exports_the_eviction_count_and_one_per_worker_is_read() -> None:
    engine = kv_bound_engine(0.5, workers=2)
    scrape(engine, 20)
    text = metrics.render(metrics.registry_for(engine, "m", RANKS)).decode()
    series = [
        s
        for f in text_string_to_metric_families(text)
        if f.name == "sglang:evicted_tokens"
        for s in f.samples
        if s.name.endswith("_total")
    ]
    assert len(series) == RANKS  # 2 DP workers × 4 attention-TP ranks
    assert {s.labels["cache_type"] for s in series} == {"UnifiedRadixCache"}
    per_worker = [w.evicted_tokens_total for w in engine.worker_stats()]
    assert sum(per_worker) > 0
    assert parse_metrics(text).evicted_tokens_total == sum(per_worker)  # not × 4


def test_a_new_servers_counters_start_the_window_afresh() -> None:
    now = [0.0]
    window = PrefixWindow(clock=lambda: now[0])

    def serve(engine: Engine, seconds: float) -> None:
        registry = metrics.registry_for(engine, "m", RANKS)
        start = now[0]
        while now[0] < start + seconds:
            now[0] += 2
            for k in range(20):
                engine.tick(now[0] - start - 2 + 0.1 * (k + 1))
            window.observe(parse_metrics(metrics.render(registry).decode()))

    serve(kv_bound_engine(0.5), 60)
    shared = window.evidence()
    assert shared is not None and shared.hit_rate is not None and shared.hit_rate > 0.15
    serve(kv_bound_engine(0.0), 30)  # a restart: counters from 0, unique prompts now
    fresh = window.evidence()
    assert fresh is not None and fresh.window_s < 30  # the new server's samples only
    assert fresh.hit_rate == 0
