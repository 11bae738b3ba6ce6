"""The simulated server's ``/metrics``: SGLang 0.5.23's metric names and labels.

SGLang exports the scheduler's gauges from the first rank only (``tp_rank`` 0, ``pp_rank``
0; ``--enable-metrics-for-all-schedulers`` is off by default) with the labels
``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``
(observability/metrics_collector.py, the scheduler collector's labels), and the tokenizer's
counters with ``model_name`` and ``engine_type`` (``tokenizer_metric_labels``).
``engine_type`` is ``unified`` outside prefill/decode disaggregation. With DP workers
(attention DP, or DP replicas) each worker's scheduler exports its own gauges, from the
first rank of its group, with a ``dp_rank`` label (``metrics_collector.py:1360-1393``); a
scraper sums them (the supervisor's telemetry does).

The radix cache's own counters (``sglang:evicted_tokens_total``,
``sglang:load_back_tokens_total``: ``RadixCacheMetricsCollector``, :2434-2560) come from
*every* rank, each counting its own KV shard under ``cache_type``, ``tp_rank`` (the
attention-TP rank), ``pp_rank`` and ``dp_rank`` (``radix_cache_metric_labels``,
:2414-2432): summed over ranks they are TP × the tokens, so a scraper reads one rank per
DP worker. ``cache_type`` is the tree's class, ``UnifiedRadixCache`` by default
(``mem_cache/registry.py:83-147``).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sglang_supervisor.sim.load import Engine, EngineStats

SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER_LABELS = ("model_name", "engine_type")
RADIX_CACHE_LABELS = ("cache_type", "tp_rank", "pp_rank", "dp_rank")
#: The tree SGLang 0.5.23 builds by default (``mem_cache/registry.py:147``).
RADIX_CACHE_TYPE = "UnifiedRadixCache"


class SglangMetrics(Collector):
    """SGLang's metric names, read from the engine at scrape time."""

    def __init__(self, engine: Engine, model_name: str, ranks: int = 1) -> None:
        self._engine = engine
        self._model = model_name
        self._ranks = ranks

    def collect(self) -> Iterator[Metric]:
        parts = self._engine.worker_stats()
        attn_tp = max(1, self._ranks // len(parts))
        labels = list(SCHEDULER_LABELS) + (["dp_rank"] if len(parts) > 1 else [])
        families = [
            ("sglang:num_running_reqs", "The number of running requests."),
            ("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
            ("sglang:num_used_tokens", "The number of used tokens."),
            ("sglang:token_usage", "The token usage."),
            ("sglang:gen_throughput", "The generation throughput (token/s)."),
            ("sglang:cache_hit_rate", "The prefix cache hit rate."),
            ("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."),
            (
                "sglang:kv_evictable_tokens",
                "Number of evictable (radix-cached) token slots in the KV cache pool.",
            ),
            ("sglang:new_token_ratio", "The new token ratio."),
        ]
        hicache = self._engine.host_cache_tokens > 0
        if hicache:  # only with the hierarchical cache (metrics_collector.py:767-779)
            families += [
                (
                    "sglang:hicache_host_used_tokens",
                    "Number of tokens currently used in the host KV cache.",
                ),
                (
                    "sglang:hicache_host_total_tokens",
                    "Total capacity of the host KV cache in tokens.",
                ),
            ]
        gauges = {name: GaugeMetricFamily(name, doc, labels=labels) for name, doc in families}
        for worker, w in enumerate(parts):
            tp_rank = str(worker * attn_tp)
            values = [self._model, "unified", tp_rank, "0", "0"]
            if len(parts) > 1:
                values.append(str(worker))
            for name, value in (
                ("sglang:num_running_reqs", w.running),
                ("sglang:num_queue_reqs", w.queued),
                ("sglang:num_used_tokens", w.tokens),
                ("sglang:token_usage", w.token_usage),
                ("sglang:gen_throughput", w.gen_throughput),
                ("sglang:cache_hit_rate", w.cache_hit_rate),
                ("sglang:max_total_num_tokens", self._engine.max_total_num_tokens),
                ("sglang:kv_evictable_tokens", w.evictable_tokens),
                *(
                    (
                        ("sglang:hicache_host_used_tokens", w.host_used_tokens),
                        ("sglang:hicache_host_total_tokens", w.host_total_tokens),
                    )
                    if hicache
                    else ()
                ),
                ("sglang:new_token_ratio", w.new_token_ratio),
            ):
                gauges[name].add_metric(values, value)
        yield from gauges.values()
        yield from self._radix_cache(parts, attn_tp)
        retracted = CounterMetricFamily(
            "sglang:num_retracted_requests", "Total number of retracted requests.", labels=labels
        )
        for worker, w in enumerate(parts):
            values = [self._model, "unified", str(worker * attn_tp), "0", "0"]
            retracted.add_metric(
                values + ([str(worker)] if len(parts) > 1 else []), w.retracted_total
            )
        yield retracted
        s = self._engine.stats()
        counters: list[tuple[str, str, float]] = [
            ("sglang:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens_total),
            (
                "sglang:generation_tokens",
                "Number of generation tokens processed.",
                s.generation_tokens_total,
            ),
        ]
        for name, doc, value in counters:
            c = CounterMetricFamily(name, doc, labels=list(TOKENIZER_LABELS))
            c.add_metric([self._model, "unified"], value)
            yield c
        cached = CounterMetricFamily(
            "sglang:cached_tokens",
            "Number of cached prompt tokens by source (device/host/storage).",
            labels=[*TOKENIZER_LABELS, "cache_source"],
        )
        for source, value in (
            ("device", s.cached_device_tokens_total),
            ("host", s.cached_host_tokens_total),
        ):
            if value > 0:  # SGLang reports a source once it served tokens (:2118-2124)
                cached.add_metric([self._model, "unified", source], value)
        yield cached
        # Every request that ended, finished or aborted (metrics_collector.py:1941, with
        # ``is_streaming``; ``observe_one_finished_request`` counts aborted ones too).
        n = CounterMetricFamily(
            "sglang:num_requests",
            "Number of requests processed.",
            labels=[*TOKENIZER_LABELS, "is_streaming"],
        )
        n.add_metric([self._model, "unified", "false"], s.requests_total)
        yield n
        aborted = CounterMetricFamily(
            "sglang:num_aborted_requests",
            "Number of requests aborted.",
            labels=list(TOKENIZER_LABELS),
        )
        aborted.add_metric([self._model, "unified"], s.aborted_total)
        yield aborted
        # SGLang's TTFT histogram (metrics_collector.py:2040, with ``is_streaming``): the
        # simulation keeps the sum and the count, so only the +Inf bucket is exported.
        h = HistogramMetricFamily(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels=[*TOKENIZER_LABELS, "is_streaming"],
        )
        h.add_metric(
            [self._model, "unified", "false"], [("+Inf", s.ttft_count)], sum_value=s.ttft_sum_s
        )
        yield h
        # The inter-token latency (metrics_collector.py:2050): one observation per token
        # after a request's first, its interval since the one before.
        itl = HistogramMetricFamily(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labels=list(TOKENIZER_LABELS),
        )
        itl.add_metric([self._model, "unified"], [("+Inf", s.itl_count)], sum_value=s.itl_sum_s)
        yield itl

    def _radix_cache(self, parts: list[EngineStats], attn_tp: int) -> Iterator[Metric]:
        """Each rank's radix-cache counters: its DP worker's tree, the same count on every
        attention-TP rank of the worker."""
        evicted = CounterMetricFamily(
            "sglang:evicted_tokens",
            "The number of device KV token slots freed by eviction, regardless of whether "
            "the data was backed up to host or destroyed.",
            labels=list(RADIX_CACHE_LABELS),
        )
        load_back = CounterMetricFamily(
            "sglang:load_back_tokens",
            "The number of tokens loaded back from local host DRAM (L2) to GPU, by host pool.",
            labels=[*RADIX_CACHE_LABELS, "pool"],
        )
        for worker, w in enumerate(parts):
            for tp_rank in range(attn_tp):
                labels = [RADIX_CACHE_TYPE, str(tp_rank), "0", str(worker)]
                evicted.add_metric(labels, w.evicted_tokens_total)
                if self._engine.host_cache_tokens > 0:
                    load_back.add_metric([*labels, "kv"], w.load_back_tokens_total)
        yield evicted
        if self._engine.host_cache_tokens > 0:
            yield load_back


def decode_lines(engine: Engine, ranks: int) -> list[tuple[str, str]]:
    """SGLang's ``Decode batch`` line of each DP worker that has requests, with the rank
    that logs it (``DP<i> TP<first rank of the group>`` with DP workers, else ``TP0``)."""
    parts = engine.worker_stats()
    attn_tp = max(1, ranks // len(parts))
    out = []
    for worker, s in enumerate(parts):
        if not (s.running or s.queued):
            continue
        who = f"DP{worker} TP{worker * attn_tp}" if len(parts) > 1 else "TP0"
        out.append(
            (
                who,
                f"Decode batch, #running-req: {s.running}, #token: {s.tokens}, "
                f"token usage: {s.token_usage:.2f}, cuda graph: {s.cuda_graph}, "
                f"gen throughput (token/s): {s.gen_throughput:.2f}, #queue-req: {s.queued}",
            )
        )
    return out


def registry_for(engine: Engine, model_name: str, ranks: int = 1) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SglangMetrics(engine, model_name, ranks))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
