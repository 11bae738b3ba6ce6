"""The server's recent load, kept by the daemon: what the status page draws when it opens.

One ``Sample`` per telemetry read (every ``TELEMETRY_INTERVAL_S``, 2 s), in a ring of
``MAX_SAMPLES`` (one hour): it never grows with requests or uptime. ``GET /history``
serves it column by column. Time to first token is SGLang's histogram
(``sglang:time_to_first_token_seconds``): the mean over each interval is the increase of
its sum over the increase of its count (None when no request got its first token then).
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


class LoadHistory:
    """A bounded ring of load samples; ``samples`` is an immutable copy for readers."""

    def __init__(
        self, max_samples: int = MAX_SAMPLES, *, wall: Callable[[], float] = time.time
    ) -> None:
        self.max_samples = max_samples
        self._ring: deque[Sample] = deque(maxlen=max_samples)
        self._wall = wall
        self._ttft: tuple[float, float] | None = None
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
        self._ring.append(
            Sample(
                round(self._wall(), 3),
                t.running_requests,
                t.queued_requests,
                self._ttft_since_last(t),
                t.cache_hit_rate,
                t.gen_tokens_per_s,
                t.token_usage,
            )
        )
        self.samples = tuple(self._ring)

    def _ttft_since_last(self, t: Throughput) -> float | None:
        if t.ttft_seconds_sum is None or t.ttft_count is None:
            self._ttft = None
            return None
        last, self._ttft = self._ttft, (t.ttft_seconds_sum, t.ttft_count)
        if last is None:
            return None
        count = t.ttft_count - last[1]
        if count <= 0:  # nothing new, or a new server's counters started again
            return None
        return round(max(0.0, t.ttft_seconds_sum - last[0]) / count, 4)


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
