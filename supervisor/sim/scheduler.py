"""One DP worker's scheduler state in the simulated load (``_Worker``: its queue, KV
pool, radix cache and counters) and what the load engine reports (``EngineStats`` per
worker or summed, ``GenResult`` per request, ``Ticket`` between submit and finish).
"""

from __future__ import annotations

from collections import Counter, deque
from typing import NamedTuple

from sglang_supervisor.sim.prefixcache import PrefixCache
from sglang_supervisor.sim.workload import HIT_RATE_WINDOW, Request


class EngineStats(NamedTuple):
    running: int
    queued: int
    tokens: int
    token_usage: float
    gen_throughput: float
    cache_hit_rate: float
    generation_tokens_total: int
    prompt_tokens_total: int
    #: Whether the current decode batch replays a captured CUDA graph.
    cuda_graph: bool
    turned_away_total: int
    #: Time to first token of every admitted request: seconds summed, and how many.
    ttft_sum_s: float = 0.0
    ttft_count: int = 0
    #: The radix cache (``sim.prefixcache``): device tokens freed by eviction, cached
    #: tokens now evictable on the device, prompt tokens served from each tier, tokens
    #: loaded back from the host tier, and the host tier's use and size.
    evicted_tokens_total: int = 0
    evictable_tokens: int = 0
    cached_device_tokens_total: int = 0
    cached_host_tokens_total: int = 0
    load_back_tokens_total: int = 0
    host_used_tokens: int = 0
    host_total_tokens: int = 0


class GenResult(NamedTuple):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    latency_s: float


#: A real request's handle between ``Engine.submit`` and ``Engine.finish``.
Ticket = Request


class _Worker:
    """One DP worker's scheduler: its queue, KV pool, radix cache and counters."""

    def __init__(self, host_cache_tokens: int = 0) -> None:
        self.pending: deque[Request] = deque()
        self.running = 0
        self.real_running = 0
        self.used = 0
        self.gen_total = 0
        self.prompt_total = 0
        self.ttft_sum_s = 0.0
        self.ttft_count = 0
        self.window: deque[tuple[int, int]] = deque(maxlen=HIT_RATE_WINDOW)
        self.running_keys: Counter[str] = Counter()
        #: The radix cache: device and host tiers, SGLang's eviction counters.
        self.cache = PrefixCache(host_cache_tokens)

    def hit(self, req: Request) -> bool:
        return self.running_keys[req.key] > 0 or self.cache.where(req.key) is not None
