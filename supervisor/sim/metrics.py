"""The simulated server's ``/metrics``: SGLang 0.5.23's metric names and labels.

SGLang exports the scheduler's gauges from the first rank only (``tp_rank`` 0, ``pp_rank``
0; ``--enable-metrics-for-all-schedulers`` is off by default) with the labels
``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``, ``moe_ep_rank``
(observability/metrics_collector.py, the scheduler collector's labels), and the tokenizer's
counters with ``model_name`` and ``engine_type`` (``tokenizer_metric_labels``).
``engine_type`` is ``unified`` outside prefill/decode disaggregation.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from supervisor.sim.load import Engine

SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER_LABELS = ("model_name", "engine_type")


class SglangMetrics(Collector):
    """SGLang's metric names, read from the engine at scrape time."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self._engine = engine
        self._model = model_name

    def collect(self) -> Iterator[Metric]:
        s = self._engine.stats()
        gauges: list[tuple[str, str, float]] = [
            ("sglang:num_running_reqs", "The number of running requests.", s.running),
            ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", s.queued),
            ("sglang:num_used_tokens", "The number of used tokens.", s.tokens),
            ("sglang:token_usage", "The token usage.", s.token_usage),
            ("sglang:gen_throughput", "The generation throughput (token/s).", s.gen_throughput),
            ("sglang:cache_hit_rate", "The prefix cache hit rate.", s.cache_hit_rate),
            (
                "sglang:max_total_num_tokens",
                "Maximum total number of tokens in the KV cache pool.",
                self._engine.max_total_num_tokens,
            ),
        ]
        rank0 = [self._model, "unified", "0", "0", "0"]
        for name, doc, value in gauges:
            g = GaugeMetricFamily(name, doc, labels=list(SCHEDULER_LABELS))
            g.add_metric(rank0, value)
            yield g
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


def registry_for(engine: Engine, model_name: str) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SglangMetrics(engine, model_name))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
