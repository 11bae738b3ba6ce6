"""The server's recent load, kept by the daemon: what the status page draws when it opens.

One ``Sample`` per telemetry read (every ``TELEMETRY_INTERVAL_S``, 2 s), in a ring of
``MAX_SAMPLES`` (one hour): it never grows with requests or uptime. ``GET /history``
serves it column by column; ``observe.effect`` compares windows of it before and after
a change. Time to first token and the inter-token latency are SGLang's histograms
(``sglang:time_to_first_token_seconds``, ``sglang:inter_token_latency_seconds``): the
mean over each interval is the increase of its sum over the increase of its count (None
when nothing was observed then). The arrival rate (the offered load) is what came in
over the interval: the requests that ended (``sglang:num_requests_total``) plus the
change in those running and queued, per second (None without the counter, or when a new
server's counter started again).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from sglang_supervisor.observe.telemetry import Throughput

#: How many samples are kept: one hour at the telemetry interval (2 s).
MAX_SAMPLES = 1800

#: The columns of ``GET /history``, in order (``Sample``'s fields after ``t``).
COLUMNS = (
    "running_requests",
    "queued_requests",
    "ttft_s",
    "cache_hit_rate",
    "gen_tokens_per_s",
    "token_usage",
    "itl_s",
    "arrivals_per_s",
)


class Sample(NamedTuple):
    #: Unix time of the read.
    t: float
    running_requests: float | None
    queued_requests: float | None
    #: Mean time to first token over the interval before ``t`` (seconds).
    ttft_s: float | None
    cache_hit_rate: float | None
    gen_tokens_per_s: float | None
    token_usage: float | None
    #: Mean inter-token latency over the interval before ``t`` (seconds).
    itl_s: float | None = None
    #: Requests that arrived per second over the interval before ``t``.
    arrivals_per_s: float | None = None


class LoadHistory:
    """A bounded ring of load samples; ``samples`` is an immutable copy for readers."""

    def __init__(
        self, max_samples: int = MAX_SAMPLES, *, wall: Callable[[], float] = time.time
    ) -> None:
        self.max_samples = max_samples
        self._ring: deque[Sample] = deque(maxlen=max_samples)
        self._wall = wall
        self._means: dict[str, tuple[float, float] | None] = {"ttft": None, "itl": None}
        #: The last read's (time, requests ended, requests running and queued).
        self._arrivals: tuple[float, float, float] | None = None
        self._last: Throughput | None = None
        #: The ring as of the last ``record``: views take it without a copy.
        self.samples: tuple[Sample, ...] = ()

    def record(self, t: Throughput) -> None:
        """One telemetry read (an empty ``Throughput`` with no server: a gap). The read
        recorded last time, offered again, is a gap too: no new reading came since (a
        slow scrape, or the previous server's figures before the new one is read)."""
        if t is self._last:
            t = Throughput()
        else:
            self._last = t
        # The read's own time: the sample is recorded on a later tick (up to an interval
        # after), and a window of the history must hold what the server did in it.
        now = round(t.read_at if t.read_at is not None else self._wall(), 3)
        if self._ring and now < self._ring[-1].t:
            now = self._ring[-1].t  # never out of order (GET /history?since= relies on it)
        self._ring.append(
            Sample(
                now,
                t.running_requests,
                t.queued_requests,
                self._mean_since_last("ttft", t.ttft_seconds_sum, t.ttft_count),
                t.cache_hit_rate,
                t.gen_tokens_per_s,
                t.token_usage,
                self._mean_since_last("itl", t.itl_seconds_sum, t.itl_count),
                self._arrivals_since_last(now, t),
            )
        )
        self.samples = tuple(self._ring)

    def _mean_since_last(self, key: str, total: float | None, count: float | None) -> float | None:
        """A histogram's mean over the interval: the increase of its sum over its count's."""
        if total is None or count is None:
            self._means[key] = None
            return None
        last, self._means[key] = self._means[key], (total, count)
        if last is None:
            return None
        n = count - last[1]
        if n <= 0:  # nothing new, or a new server's counters started again
            return None
        return round(max(0.0, total - last[0]) / n, 4)

    def _arrivals_since_last(self, now: float, t: Throughput) -> float | None:
        """Requests that came in per second since the last read: those that ended plus
        the growth of those running and queued."""
        if t.requests_total is None or t.running_requests is None or t.queued_requests is None:
            self._arrivals = None
            return None
        last = self._arrivals
        self._arrivals = (now, t.requests_total, t.running_requests + t.queued_requests)
        if last is None or now <= last[0] or t.requests_total < last[1]:
            return None  # the first read, or a new server's counter
        came = t.requests_total - last[1] + self._arrivals[2] - last[2]
        return round(max(0.0, came) / (now - last[0]), 4)


def history_json(
    samples: tuple[Sample, ...], interval_s: float, max_samples: int
) -> dict[str, Any]:
    """``GET /history``: the samples column by column (``t`` and each of ``COLUMNS``)."""
    return {
        "interval_s": interval_s,
        "max_samples": max_samples,
        "columns": ["t", *COLUMNS],
        "t": [s.t for s in samples],
        **{name: [getattr(s, name) for s in samples] for name in COLUMNS},
    }
