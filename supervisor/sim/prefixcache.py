"""One DP worker's prefix (radix) cache in the simulated load, and the counters SGLang
0.5.23 exports about it.

Two tiers, each least-recently-used first out: the device tier holds what fits the worker's
free KV pool (SGLang's radix cache keeps finished requests' KV there, evictable); the
host tier — only with the hierarchical cache — holds what the device tier evicted, up to
the host pool's tokens; what falls off the host tier is gone. A hit in the host tier is
loaded back onto the device. Every finished request leaves its KV in the tree, the shared
prefix (reused by later requests) and its own unique rest (never reused), so unique
prompts evict as much as shared ones: eviction alone does not tell reuse, the hit rate
does.

The counters, under SGLang's names (``srt/observability/metrics_collector.py``,
SGLang 0.5.23):

- ``evicted_total``: device KV tokens freed by eviction, backed up to host or not
  (``sglang:evicted_tokens_total``, ``RadixCacheMetricsCollector``, :2534-2541; counted
  in ``mem_cache/base_prefix_cache.py:419-424`` ``update_eviction_metrics``);
- ``load_back_total``: tokens loaded back from the host tier
  (``sglang:load_back_tokens_total``, :2552-2560);
- ``cached_device_total`` / ``cached_host_total``: prompt tokens served from the cache
  by where they were found (``sglang:cached_tokens_total{cache_source}``, :1934-1938,
  :2114-2124).
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixCache:
    """The two tiers and their counters (the engine's lock is held by every caller)."""

    def __init__(self, host_tokens: int = 0) -> None:
        self.host_tokens = max(0, host_tokens)
        self._device: OrderedDict[str, int] = OrderedDict()
        self._host: OrderedDict[str, int] = OrderedDict()
        self.device_used = 0
        self.host_used = 0
        self.evicted_total = 0
        self.load_back_total = 0
        self.cached_device_total = 0
        self.cached_host_total = 0

    def where(self, key: str) -> str | None:
        """``"device"``, ``"host"`` or None: where ``key``'s KV is cached."""
        if key in self._device:
            return "device"
        if key in self._host:
            return "host"
        return None

    def served(self, source: str, tokens: int) -> None:
        """``tokens`` of a prompt were found in the ``source`` tier."""
        if source == "host":
            self.cached_host_total += tokens
        else:
            self.cached_device_total += tokens

    def insert(self, key: str, tokens: int, device_room: int) -> None:
        """``key``'s ``tokens`` are the most recently used on the device (loaded back
        from the host tier if they were there); then evict down to ``device_room``."""
        if key in self._device:
            self._device.move_to_end(key)
        else:
            held = self._host.pop(key, None)
            if held is not None:
                self.host_used -= held
                self.load_back_total += held
            self._device[key] = tokens
            self.device_used += tokens
        self.evict(device_room)

    def evict(self, device_room: int) -> None:
        """Evict the device tier's oldest entries until it fits ``device_room``: into the
        host tier (with a host pool), whose oldest fall off in turn."""
        room = max(0, device_room)
        while self.device_used > room and self._device:
            key, size = self._device.popitem(last=False)
            self.device_used -= size
            self.evicted_total += size
            if self.host_tokens and size <= self.host_tokens:
                self._host[key] = size
                self.host_used += size
        while self.host_used > self.host_tokens and self._host:
            _, size = self._host.popitem(last=False)
            self.host_used -= size
