"""Live loads for planner tests: the gauges of a KV-bound server and its prefix cache's
evidence (``planner.prefixcache``), so a test says which evidence a proposal rests on."""

from __future__ import annotations

from sglang_supervisor.planner import LiveLoad
from sglang_supervisor.planner.prefixcache import PrefixEvidence

#: Half-shared prompts on the simulated KV-bound load (tests/unit/test_prefix_evidence.py
#: measures these): a third of the prompt tokens come from the cache, and the device pool
#: evicts about a token per prompt token.
REUSED_PREFIXES_EVICTED = PrefixEvidence(
    window_s=180.0,
    prompt_tokens_per_s=690_000.0,
    hit_rate=0.28,
    hit_rate_source="sglang:cached_tokens_total / sglang:prompt_tokens_total",
    evicted_tokens_per_s=650_000.0,
    load_back_tokens_per_s=None,
    evictable_tokens=16_000.0,
    host_pool_tokens=0.0,
)
#: Unique prompts: they evict as much, but nothing comes back.
UNIQUE_PROMPTS = PrefixEvidence(
    window_s=180.0,
    prompt_tokens_per_s=617_000.0,
    hit_rate=0.0,
    hit_rate_source="sglang:cached_tokens_total / sglang:prompt_tokens_total",
    evicted_tokens_per_s=577_000.0,
    load_back_tokens_per_s=None,
    evictable_tokens=33_000.0,
    host_pool_tokens=0.0,
)


def kv_bound(prefix_cache: PrefixEvidence | None = REUSED_PREFIXES_EVICTED) -> LiveLoad:
    """A KV-bound server (the diagnosis's rule: usage above 0.95, more than 10 queued)."""
    return LiveLoad(
        running_requests=80,
        queued_requests=300,
        token_usage=0.99,
        prefix_cache=prefix_cache,
    )
