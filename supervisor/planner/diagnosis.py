"""Where the server's bottleneck is: one rule for ``/status``'s ``diagnosis``, the plan's
sentence and the ``SglangKvCacheExhausted`` alert's thresholds.

The rule (``classify``) reads SGLang's own gauges, as the alert does
(``deploy/prometheus/alerts.yml``: ``token_usage_ratio > 0.95`` and ``queued_requests >
10``; the test ``tests/unit/test_diagnosis.py`` holds the alert's literals to the constants
here):

- ``kv_bound``: token usage above ``KV_BOUND_TOKEN_USAGE`` with more than ``QUEUE_LIMIT``
  requests waiting: the KV cache is full of running requests and new ones wait for space.
- ``queue_bound``: more than ``QUEUE_LIMIT`` wait while the KV cache has room: the limit is
  ``max_running_requests`` or compute, not KV memory.
- ``not_saturated``: at most ``QUEUE_LIMIT`` wait (short bursts queue).
- ``no_metrics``: the server says nothing of its load (no server, or not scraped yet).

``Diagnoser`` holds a kind for ``hold_s`` before it reports it, as the alert's ``for:``
does (``[timeouts] diagnosis_hold_s``, 180 s like the alert's ``3m``); ``no_metrics`` is
reported at once (a server that is gone is not KV-bound any more). The alert's extra
"and the queue grows, or more than 50 wait" is left to the hold: a queue of more than 10
that stays for the whole hold.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Protocol

from sglang_supervisor.planner.prefixcache import (
    MIN_WINDOW_S,
    CacheCounters,
    PrefixEvidence,
    PrefixWindow,
)

#: Token usage (the fullest DP worker's pool) above which a queue means KV-bound.
KV_BOUND_TOKEN_USAGE = 0.95
#: Waiting requests above which the server counts as saturated (short bursts queue).
QUEUE_LIMIT = 10
#: How long a kind must hold before it is reported (the alert's ``for: 3m``).
DEFAULT_HOLD_S = 180.0


class Gauges(CacheCounters, Protocol):
    """SGLang's load gauges (and its prefix cache's counters: ``planner.prefixcache``) as
    the telemetry reads them (``observe.telemetry.Throughput``)."""

    @property
    def running_requests(self) -> float | None: ...
    @property
    def queued_requests(self) -> float | None: ...
    @property
    def token_usage(self) -> float | None: ...


class LoadKind(StrEnum):
    KV_BOUND = "kv_bound"
    QUEUE_BOUND = "queue_bound"
    NOT_SATURATED = "not_saturated"
    NO_METRICS = "no_metrics"


def classify(running: float | None, queued: float | None, usage: float | None) -> LoadKind:
    """The kind of load these gauges show (the one rule; module docstring)."""
    if usage is None and running is None and queued is None:
        return LoadKind.NO_METRICS
    waiting = queued or 0
    if waiting > QUEUE_LIMIT and usage is not None and usage > KV_BOUND_TOKEN_USAGE:
        return LoadKind.KV_BOUND
    if waiting > QUEUE_LIMIT:
        return LoadKind.QUEUE_BOUND
    return LoadKind.NOT_SATURATED


def sentence(
    running: float | None,
    queued: float | None,
    usage: float | None,
    kind: LoadKind | None = None,
) -> str:
    """The kind of load, in one sentence with its figures (the plan's ``diagnosis``);
    ``kind`` when the daemon's diagnosis held one (else these gauges' own)."""
    kind = kind or classify(running, queued, usage)
    run, wait = int(running or 0), int(queued or 0)
    use = f"{usage:.2f}" if usage is not None else "unknown"
    if kind is LoadKind.NO_METRICS:
        return "no live metrics yet: the plan rests on the model and the hardware alone"
    if kind is LoadKind.KV_BOUND:
        return (
            f"KV-cache bound: token usage {use} with {run} requests running and "
            f"{wait} queued — more KV tokens per GPU let more requests run at once"
        )
    if kind is LoadKind.QUEUE_BOUND:
        return (
            f"requests queue ({wait}) while the KV cache is {use} used with {run} "
            "running: the limit is max_running_requests or compute, not KV memory"
        )
    queue = "none queued" if wait == 0 else f"{wait} queued (at most {QUEUE_LIMIT}: a burst)"
    return (
        f"not saturated: {run} running, {queue}, token usage {use} — the levers "
        "add headroom for load to come"
    )


#: What to do about each kind (None: nothing to do).
PROPOSALS: dict[LoadKind, str | None] = {
    LoadKind.KV_BOUND: (
        "raise KV capacity in one restart: POST /plan (`sglang-supervisor plan`) proposes "
        "mem_fraction_static, kv_cache_dtype, chunked_prefill_size and "
        "max_running_requests; dry-run it, then apply it (last-good comes back if it fails)"
    ),
    LoadKind.QUEUE_BOUND: (
        "more KV memory will not help: raise max_running_requests if the GPUs have "
        "compute to spare, else add replicas (POST /plan shows the capacity)"
    ),
    LoadKind.NOT_SATURATED: None,
    LoadKind.NO_METRICS: None,
}


@dataclass(frozen=True)
class Diagnosis:
    """``/status``'s ``diagnosis``: the reported kind, since when (unix time), why."""

    kind: LoadKind
    since: float
    evidence: dict[str, Any] = field(default_factory=dict)
    message: str = ""
    proposal: str | None = None
    #: The prefix cache's evidence over the recent window (None: not enough of it yet).
    prefix_cache: PrefixEvidence | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "since": round(self.since, 3),
            "evidence": dict(self.evidence),
            "message": self.message,
            "proposal": self.proposal,
            "prefix_cache": None if self.prefix_cache is None else self.prefix_cache.to_json(),
        }


class Diagnoser:
    """Classifies each telemetry sample and reports a kind once it held for ``hold_s``.

    ``clock`` (monotonic) times the hold; ``wall`` stamps ``since`` for people. ``hold_s``
    may be a callable, read at each sample: the daemon's ``[timeouts] diagnosis_hold_s``,
    which a SIGHUP may change.
    """

    def __init__(
        self,
        hold_s: float | Callable[[], float] = DEFAULT_HOLD_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._hold = hold_s if callable(hold_s) else (lambda: hold_s)
        self._clock = clock
        self._wall = wall
        now, stamp = clock(), wall()
        self._candidate = LoadKind.NO_METRICS
        self._candidate_at = now
        self._candidate_since = stamp
        #: The prefix cache's counters over the recent past (the host cache's evidence).
        self.prefix = PrefixWindow(clock)
        self.current = Diagnosis(
            LoadKind.NO_METRICS, stamp, message=sentence(None, None, None), evidence={}
        )

    @property
    def hold_s(self) -> float:
        """How long a kind must hold before it is reported (now)."""
        return self._hold()

    def observe(self, load: Gauges) -> None:
        """One telemetry sample: classify it, and report its kind once it has held."""
        running, queued, usage = load.running_requests, load.queued_requests, load.token_usage
        now, stamp = self._clock(), self._wall()
        self.prefix.observe(load)
        kind = classify(running, queued, usage)
        if kind is not self._candidate:
            self._candidate, self._candidate_at, self._candidate_since = kind, now, stamp
        held = now - self._candidate_at
        reported = self.current.kind
        if kind is reported or kind is LoadKind.NO_METRICS or held >= self.hold_s:
            since = self.current.since if kind is reported else self._candidate_since
            pending = None
            self.current = self._diagnosis(kind, since, running, queued, usage, held, pending)
        else:
            pending = {"kind": str(kind), "since": round(self._candidate_since, 3)}
            self.current = Diagnosis(
                reported,
                self.current.since,
                {**self.current.evidence, "pending": pending},
                self.current.message,
                self.current.proposal,
            )
        # Over the same hold as the kind's (the alert's ``for:``), at least 20 s of it.
        hold = self.hold_s
        evidence = self.prefix.evidence(hold, min(MIN_WINDOW_S, hold))
        self.current = replace(self.current, prefix_cache=evidence)

    def _diagnosis(
        self,
        kind: LoadKind,
        since: float,
        running: float | None,
        queued: float | None,
        usage: float | None,
        held: float,
        pending: dict[str, Any] | None,
    ) -> Diagnosis:
        evidence = {
            "running_requests": running,
            "queued_requests": queued,
            "token_usage": usage,
            "thresholds": {"token_usage_above": KV_BOUND_TOKEN_USAGE, "queued_above": QUEUE_LIMIT},
            "held_s": round(held, 3),
            "hold_s": self.hold_s,
            "pending": pending,
        }
        return Diagnosis(kind, since, evidence, sentence(running, queued, usage), PROPOSALS[kind])
