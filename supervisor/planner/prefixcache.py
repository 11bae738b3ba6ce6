"""The prefix cache's evidence, read from the server's own counters, and the one rule for
proposing the hierarchical cache.

The hierarchical cache is a prefix cache: it keeps in pinned host RAM what the device's
radix cache evicts, so a prefix reused later is loaded back instead of recomputed. It
never lets more requests run at once (running requests' KV lives on the GPU), and it costs
time without service at every stop and start (pinning and unpinning the pool). So it is
proposed only where SGLang's own metrics show reused prefixes lost to eviction:

- **reuse**: the cache hit rate over the window — prompt tokens served from the cache over
  prompt tokens (``sglang:cached_tokens_total`` / ``sglang:prompt_tokens_total``), else the
  mean of ``sglang:cache_hit_rate`` — is at least ``MIN_HIT_RATE``. Unique prompts share
  nothing: they evict as much as shared ones (every finished request leaves its KV in the
  tree), so eviction alone is never the evidence;
- **eviction**: the device pool evicts at least ``MIN_EVICTED_PER_PROMPT_TOKEN`` token per
  prompt token (``sglang:evicted_tokens_total``, SGLang 0.5.23
  ``observability/metrics_collector.py:2534-2541``): below that the device keeps what is
  reused and a host pool adds nothing.

How long an evicted prefix survives says what the host pool buys: today a prefix lasts
about ``kv_evictable_tokens / evicted tokens per second`` in the device pool after its last
use; a host pool of H tokens keeps it H / that rate longer (at today's eviction rate).

``PrefixWindow`` keeps the telemetry samples (fed with the diagnosis's, every 2 s; at most
``MAX_SAMPLES``) and starts afresh when a counter goes down (a new server).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple, Protocol

#: The cache hit rate from which prompts count as sharing prefixes.
MIN_HIT_RATE = 0.10
#: Device tokens evicted per prompt token from which the device pool counts as evicting.
MIN_EVICTED_PER_PROMPT_TOKEN = 0.10
#: The evidence is read over this much of the recent past (the diagnosis's hold, 3 min
#: by default: ``[timeouts] diagnosis_hold_s``)...
WINDOW_S = 180.0
#: ...and needs at least this much of it (or the whole hold, when shorter).
MIN_WINDOW_S = 20.0
#: Samples kept: more than ``WINDOW_S`` at the telemetry's 2 s.
MAX_SAMPLES = 128


class CacheCounters(Protocol):
    """The server's prefix-cache figures as the telemetry reads them
    (``observe.telemetry.Throughput``)."""

    @property
    def cache_hit_rate(self) -> float | None: ...
    @property
    def prompt_tokens_total(self) -> float | None: ...
    @property
    def cached_tokens_total(self) -> float | None: ...
    @property
    def evicted_tokens_total(self) -> float | None: ...
    @property
    def load_back_tokens_total(self) -> float | None: ...
    @property
    def evictable_tokens(self) -> float | None: ...
    @property
    def host_pool_tokens(self) -> float | None: ...


class _Sample(NamedTuple):
    t: float
    prompt: float | None
    cached: float | None
    evicted: float | None
    load_back: float | None
    hit_rate: float | None
    evictable: float | None
    host_pool: float | None


@dataclass(frozen=True)
class PrefixEvidence:
    """What the server's counters say of its prefix cache over ``window_s``."""

    window_s: float
    prompt_tokens_per_s: float
    hit_rate: float | None
    #: Which of SGLang's series the hit rate comes from.
    hit_rate_source: str
    #: Device tokens evicted per second (None: the server does not export the counter).
    evicted_tokens_per_s: float | None
    #: Tokens loaded back from the host pool per second (None: no hierarchical cache).
    load_back_tokens_per_s: float | None
    #: Cached tokens evictable on the device now, and the host pool's tokens (0: none).
    evictable_tokens: float | None
    host_pool_tokens: float

    @property
    def evicted_per_prompt_token(self) -> float | None:
        if self.evicted_tokens_per_s is None or self.prompt_tokens_per_s <= 0:
            return None
        return self.evicted_tokens_per_s / self.prompt_tokens_per_s

    def retention_s(self, tokens: float | None) -> float | None:
        """How long ``tokens`` of cache keep an evicted prefix at today's eviction rate."""
        if tokens is None or not self.evicted_tokens_per_s:
            return None
        return tokens / self.evicted_tokens_per_s

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["evicted_per_prompt_token"] = _round(self.evicted_per_prompt_token)
        out["device_retention_s"] = _round(self.retention_s(self.evictable_tokens))
        for key in ("window_s", "prompt_tokens_per_s", "hit_rate", "evicted_tokens_per_s"):
            out[key] = _round(out[key])
        out["load_back_tokens_per_s"] = _round(self.load_back_tokens_per_s)
        return out


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


class PrefixWindow:
    """The recent telemetry samples of the prefix cache (bounded; ``clock`` monotonic)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._samples: deque[_Sample] = deque(maxlen=MAX_SAMPLES)

    def observe(self, t: CacheCounters) -> None:
        """One telemetry read; a read without a server (no prompt counter) is skipped,
        and a counter that went down (a new server) starts the window afresh."""
        if t.prompt_tokens_total is None:
            return
        s = _Sample(
            self._clock(),
            t.prompt_tokens_total,
            t.cached_tokens_total,
            t.evicted_tokens_total,
            t.load_back_tokens_total,
            t.cache_hit_rate,
            t.evictable_tokens,
            t.host_pool_tokens,
        )
        last = self._samples[-1] if self._samples else None
        if last is not None and any(
            new is not None and old is not None and new < old
            for new, old in zip(s[1:5], last[1:5], strict=True)
        ):
            self._samples.clear()
        self._samples.append(s)

    def evidence(
        self, window_s: float = WINDOW_S, min_s: float = MIN_WINDOW_S
    ) -> PrefixEvidence | None:
        """The evidence over the last ``window_s`` (None: less than ``min_s`` of samples,
        or no prompt tokens in it)."""
        if not self._samples:
            return None
        last = self._samples[-1]
        # From the newest sample at least ``window_s`` old (the samples come every 2 s).
        older = [i for i, s in enumerate(self._samples) if s.t <= last.t - window_s]
        inside = list(self._samples)[older[-1] if older else 0 :]
        first = inside[0]
        span = last.t - first.t
        if span <= 0 or span < min_s or last.prompt is None or first.prompt is None:
            return None
        prompt = last.prompt - first.prompt
        if prompt <= 0:
            return None

        def rate(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else max(0.0, b - a) / span

        if last.cached is not None:
            # SGLang exports the counter from its first cached token on: absent before, 0.
            hit: float | None = max(0.0, last.cached - (first.cached or 0.0)) / prompt
            source = "sglang:cached_tokens_total / sglang:prompt_tokens_total"
        else:
            rates = [s.hit_rate for s in inside if s.hit_rate is not None]
            hit = sum(rates) / len(rates) if rates else None
            source = "sglang:cache_hit_rate (mean)"
        return PrefixEvidence(
            window_s=span,
            prompt_tokens_per_s=prompt / span,
            hit_rate=hit,
            hit_rate_source=source,
            evicted_tokens_per_s=rate(first.evicted, last.evicted),
            load_back_tokens_per_s=rate(first.load_back, last.load_back),
            evictable_tokens=last.evictable,
            host_pool_tokens=last.host_pool or 0.0,
        )


@dataclass(frozen=True)
class HostCacheVerdict:
    """Whether the evidence supports a host cache, and why, in one sentence."""

    supported: bool
    reason: str


def host_cache_verdict(evidence: PrefixEvidence | None) -> HostCacheVerdict:
    """The one rule (module docstring)."""
    if evidence is None:
        return HostCacheVerdict(
            False,
            "no live prefix-cache figures (no server, or less than "
            f"{MIN_WINDOW_S:.0f} s of its metrics): a host cache is proposed only where the "
            "server's own counters show reused prefixes lost to eviction",
        )
    hit = evidence.hit_rate
    if hit is None or hit < MIN_HIT_RATE:
        shown = "unknown" if hit is None else f"{hit:.2f}"
        return HostCacheVerdict(
            False,
            f"the cache hit rate is {shown} over the last {evidence.window_s:.0f} s "
            f"({evidence.hit_rate_source}; below {MIN_HIT_RATE:.2f}): the prompts share "
            "no prefixes to keep, so a host cache would hold nothing that comes back",
        )
    per_prompt = evidence.evicted_per_prompt_token
    if per_prompt is None:
        return HostCacheVerdict(
            False,
            "the server does not export sglang:evicted_tokens_total: whether reused "
            "prefixes are evicted is unknown, so no host cache is proposed",
        )
    if per_prompt < MIN_EVICTED_PER_PROMPT_TOKEN:
        return HostCacheVerdict(
            False,
            f"the device pool evicts {per_prompt:.2f} tokens per prompt token (below "
            f"{MIN_EVICTED_PER_PROMPT_TOKEN:.2f}): it keeps the reused prefixes itself; a "
            "host cache would add nothing",
        )
    kept = evidence.retention_s(evidence.evictable_tokens)
    lasts = "" if kept is None else f"; an evicted prefix lasts ≈{kept:.2g} s in the device pool"
    return HostCacheVerdict(
        True,
        f"prompts share prefixes (cache hit rate {hit:.2f}) and the device pool evicts "
        f"{evidence.evicted_tokens_per_s or 0:,.0f} tokens/s ({per_prompt:.2f} per prompt "
        f"token, sglang:evicted_tokens_total){lasts}",
    )
