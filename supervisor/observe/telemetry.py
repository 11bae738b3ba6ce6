"""What the server says about its load: SGLang's ``/metrics``, or its ``Decode batch`` lines.

SGLang's gauges: ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
``sglang:gen_throughput``, ``sglang:token_usage``, ``sglang:cache_hit_rate``; counters
``sglang:generation_tokens_total``, ``sglang:prompt_tokens_total``,
``sglang:num_requests_total`` (every request that ended); the histograms
``sglang:time_to_first_token_seconds`` and ``sglang:inter_token_latency_seconds`` (their
``_sum`` and ``_count``: the history derives each interval's mean from their increase,
and the arrival rate from the requests that ended plus the change in those running and
queued). The prefix cache's evidence (``supervisor/planner/prefixcache.py`` reads it):
the gauge ``sglang:kv_evictable_tokens``, ``sglang:hicache_host_total_tokens`` (only with
the hierarchical cache), the counters ``sglang:cached_tokens_total`` (every
``cache_source``) and the radix cache's ``sglang:evicted_tokens_total`` and
``sglang:load_back_tokens_total``, which every rank exports for its own KV shard: one rank
per DP worker is read (``tp_rank`` and ``pp_rank`` 0). When no metrics endpoint answers,
the last ``Decode batch, #running-req: ...`` line of the log is the fallback.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

_GAUGES = {
    "sglang:gen_throughput": "gen_tokens_per_s",
    "sglang:num_running_reqs": "running_requests",
    "sglang:num_queue_reqs": "queued_requests",
    "sglang:token_usage": "token_usage",
    "sglang:cache_hit_rate": "cache_hit_rate",
    "sglang:num_used_tokens": "used_tokens",
    "sglang:kv_evictable_tokens": "evictable_tokens",
    "sglang:hicache_host_total_tokens": "host_pool_tokens",
}
_COUNTERS = {
    "sglang:generation_tokens": "generation_tokens_total",
    "sglang:prompt_tokens": "prompt_tokens_total",
    "sglang:cached_tokens": "cached_tokens_total",
    "sglang:evicted_tokens": "evicted_tokens_total",
    "sglang:load_back_tokens": "load_back_tokens_total",
    #: ``metrics_collector.py:1941``: counted when a request ends (aborted ones too).
    "sglang:num_requests": "requests_total",
}
#: Counters every rank exports for its own shard (SGLang 0.5.23
#: ``radix_cache_metric_labels``): read from each DP worker's first rank only.
_PER_RANK = frozenset({"evicted_tokens_total", "load_back_tokens_total"})
#: Histogram series (SGLang 0.5.23 ``observability/metrics_collector.py:2040``), summed
#: over their labels (``is_streaming``, and per DP rank where exported).
_HISTOGRAMS = {
    "sglang:time_to_first_token_seconds_sum": "ttft_seconds_sum",
    "sglang:time_to_first_token_seconds_count": "ttft_count",
    # metrics_collector.py:2050: one observation per token after a request's first.
    "sglang:inter_token_latency_seconds_sum": "itl_seconds_sum",
    "sglang:inter_token_latency_seconds_count": "itl_count",
}


@dataclass
class Throughput:
    gen_tokens_per_s: float | None = None
    running_requests: float | None = None
    queued_requests: float | None = None
    token_usage: float | None = None
    cache_hit_rate: float | None = None
    #: KV tokens in use, summed over the DP workers' pools.
    used_tokens: float | None = None
    generation_tokens_total: float | None = None
    prompt_tokens_total: float | None = None
    #: Time to first token: the histogram's sum (seconds) and count, since the server began.
    ttft_seconds_sum: float | None = None
    ttft_count: float | None = None
    #: The prefix cache, summed over the DP workers: cached tokens evictable on the
    #: device now, the host pool's tokens (hierarchical cache), and the counters of
    #: prompt tokens served from the cache, device tokens evicted and tokens loaded back.
    evictable_tokens: float | None = None
    host_pool_tokens: float | None = None
    cached_tokens_total: float | None = None
    evicted_tokens_total: float | None = None
    load_back_tokens_total: float | None = None
    #: Inter-token latency: the histogram's sum (seconds) and count (tokens).
    itl_seconds_sum: float | None = None
    itl_count: float | None = None
    #: Requests that ended (finished or aborted), since the server began.
    requests_total: float | None = None
    #: "metrics", "log" or None (nothing read yet).
    source: str | None = None
    #: Unix time of the read (the history stamps its sample with it, not with the
    #: later tick that records it).
    read_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_metrics(text: str) -> Throughput:
    """Sum SGLang's series over their labels (one server may export per-DP-rank series).

    With priority scheduling SGLang exports each queue gauge twice over: the total under
    ``priority=""`` and a breakdown under ``priority="<n>"``
    (``srt/observability/metrics_collector.py:1417-1430``): only the total is read.
    """
    out = Throughput(source="metrics")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("priority", ""):
                continue  # a per-priority breakdown of a total counted already
            name = sample.name
            key = _GAUGES.get(name) or _HISTOGRAMS.get(name)
            if key is None and name.endswith("_total"):
                key = _COUNTERS.get(name[: -len("_total")])
            if key is None:
                continue
            rank = (sample.labels.get("tp_rank", "0"), sample.labels.get("pp_rank", "0"))
            if key in _PER_RANK and rank != ("0", "0"):
                continue  # another rank's count of the same tokens
            prev = getattr(out, key)
            value = float(sample.value)
            if key in ("token_usage", "cache_hit_rate"):
                # Ratios: keep the largest rank's value rather than a meaningless sum.
                setattr(out, key, value if prev is None else max(prev, value))
            else:
                setattr(out, key, value if prev is None else prev + value)
    return out


_DECODE = re.compile(
    r"Decode batch.*?#running-req:\s*(?P<running>\d+).*?token usage:\s*(?P<usage>[\d.]+)"
    r".*?gen throughput \(token/s\):\s*(?P<tput>[\d.]+).*?#queue-req:\s*(?P<queue>\d+)"
)


def parse_decode_line(line: str) -> Throughput | None:
    """Values from one ``Decode batch`` log line, or None if it is not one."""
    m = _DECODE.search(line)
    if m is None:
        return None
    return Throughput(
        gen_tokens_per_s=float(m["tput"]),
        running_requests=float(m["running"]),
        queued_requests=float(m["queue"]),
        token_usage=float(m["usage"]),
        source="log",
    )


def last_decode_line(log_path: Path, max_bytes: int = 256 * 1024) -> Throughput | None:
    """The newest ``Decode batch`` line in the last ``max_bytes`` of ``log_path``."""
    for line in reversed(tail_lines(log_path, 2000, max_bytes)):
        t = parse_decode_line(line)
        if t is not None:
            return t
    return None


def tail_lines(path: Path, n: int, max_bytes: int = 1024 * 1024) -> list[str]:
    """The last ``n`` lines of ``path`` (reading at most ``max_bytes`` from its end); none
    when it is not a regular file of its own (a symbolic link or a FIFO planted under a
    launch log's name is neither followed nor waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return []
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    lines = data.decode(errors="replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first line is probably cut
    return lines[-n:] if n > 0 else []
