"""The expected time without service of a lever change, part by part, from the figures
the planner uses — the plan's, the apply's (``Operation.expected_downtime``) and the
status page's one rule.

A change is a restart: drain → stop → unpin → release → pin → load and warm-up →
probation → commit. *Without service* is what the operation records
(``Operation.downtime``): from the stop to the new server's ready — stop, unpin, release,
pin, load and warm-up. The drain comes before it and the probation after: a lone server
serves during both (SGLang keeps serving while it drains; a new server on probation
answers); behind a router the replica is out of the router from its drain to the end of
its probation, while the other replicas serve.

The figures:

- **stop**: SGLang's own drain after SIGTERM, which it looks at every 5 s
  (``managers/tokenizer_manager.py:3508-3540``, SGLang 0.5.23): up to
  ``SGLANG_DRAIN_LOOK_S`` with nothing in flight; with requests in flight on a lone server
  up to ``stop_grace_s`` (it serves on meanwhile, new requests too; at the end of the grace
  what is left is cut). Behind a router the drain has emptied it first.
- **unpin** and **pin**: ``PinRates`` × the pinned GiB of the node (``planner.stopcost``:
  measured on an H200 host, ≈0.2 and ≈0.58 s per GiB).
- **release**: the NVML verdict, 13–35 ms on the H200 (``RELEASE_S``).
- **load**: the serving server's own start (spawn → ready, measured by this daemon) less
  its pinning, times the new set's weights per GPU over today's where they differ
  (attention DP replicates the attention weights); plus, for more decode CUDA graphs, the
  serving server's seconds per graph from its log's ``Capture ... CUDA graph end. bs=[...],
  elapsed=...`` (``model_executor/model_runner_components/cuda_graph_setup.py:786-791``).
  Unknown (None) where this daemon did not see the serving server start.
- **probation**: ``probation_s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_supervisor.planner.stopcost import MEASURED_RATES, PinRates
from sglang_supervisor.units import GiB

#: SGLang's SIGTERM watchdog looks at the requests left this often (tokenizer_manager.py).
SGLANG_DRAIN_LOOK_S = 5.0
#: The NVML release verdict after the last member exits (H200: 13–35 ms; rounded up).
RELEASE_S = 0.05


@dataclass(frozen=True)
class Part:
    name: str
    #: None: not known here (``basis`` says why).
    seconds: float | None
    basis: str
    #: Counted in the time without service (stop → the new server's ready).
    without_service: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seconds": None if self.seconds is None else round(self.seconds, 2),
            "basis": self.basis,
            "without_service": self.without_service,
        }


@dataclass(frozen=True)
class ServerFacts:
    """What the estimate reads of the daemon and of the serving server: its timeouts and
    router, and what it measured (the same for every change planned now)."""

    stop_grace_s: float = 30.0
    probation_s: float = 10.0
    #: The bound of a drain before the stop (the apply's ``drain_timeout_s``, or the
    #: router's ``drain_timeout_s`` behind one); 0: none.
    drain_s: float = 0.0
    behind_router: bool = False
    #: Requests running or queued now (None: not known).
    in_flight: float | None = None
    #: The serving server's spawn → ready, measured by this daemon (None: not seen).
    measured_start_s: float | None = None
    #: The serving server's seconds per decode CUDA graph, from its log (None: not known).
    graph_s_each: float | None = None
    rates: PinRates = MEASURED_RATES


@dataclass(frozen=True)
class ChangeFacts:
    """One change: the two sets' pinned host pools (one node's), the new set's weights
    per GPU over today's, the decode graphs captured before and after."""

    server: ServerFacts
    pinned_now_bytes: int
    pinned_new_bytes: int
    #: None: not known; 1.0: the same weights per GPU.
    weights_ratio: float | None = None
    #: Why the measured start may not hold for the new set (None: it does).
    load_caveat: str | None = None
    graphs_now: int | None = None
    graphs_new: int | None = None


@dataclass(frozen=True)
class Downtime:
    parts: tuple[Part, ...]
    behind_router: bool

    @property
    def seconds(self) -> float:
        """The time without service the known parts add up to."""
        return sum(p.seconds or 0.0 for p in self.parts if p.without_service)

    @property
    def complete(self) -> bool:
        """Every part without service is known (else ``seconds`` is a lower bound)."""
        return all(p.seconds is not None for p in self.parts if p.without_service)

    @property
    def until_commit_s(self) -> float:
        return sum(p.seconds or 0.0 for p in self.parts)

    def summary(self) -> str:
        """One sentence: the total, then each part that is not negligible."""
        shown = [
            f"{p.name} {_s(p.seconds)}"
            for p in self.parts
            if p.without_service and (p.seconds is None or p.seconds >= 0.5)
        ]
        total = f"≈{_s(self.seconds)}" if self.complete else f"at least {_s(self.seconds)}"
        return f"{total} without service ({', '.join(shown) or 'nothing to speak of'})"

    def to_json(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 1),
            "complete": self.complete,
            "until_commit_s": round(self.until_commit_s, 1),
            "behind_router": self.behind_router,
            "summary": self.summary(),
            "parts": [p.to_json() for p in self.parts],
        }


def _s(seconds: float | None) -> str:
    if seconds is None:
        return "not measured"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


def expected(c: ChangeFacts) -> Downtime:
    """The parts of a change's time without service (module docstring)."""
    f = c.server
    r = f.rates
    rates = f"{r.unpin_s_per_gib:g} s per GiB ({r.source})"
    parts = [
        Part(
            "drain",
            f.drain_s,
            "out of the router until no request runs or waits, at most this long"
            if f.behind_router
            else "the apply's drain_timeout_s: the server serves meanwhile"
            if f.drain_s
            else "none asked (drain_timeout_s 0)",
            without_service=f.behind_router,
        ),
        _stop(f),
        Part(
            "unpin",
            r.unpin_s(c.pinned_now_bytes),
            f"{c.pinned_now_bytes / GiB:,.0f} GiB of host cache pinned now × {rates}"
            if c.pinned_now_bytes
            else "no host cache now",
            without_service=True,
        ),
        Part("release", RELEASE_S, "NVML's verdict (13–35 ms on an H200)", without_service=True),
        Part(
            "pin",
            r.pin_s(c.pinned_new_bytes),
            f"{c.pinned_new_bytes / GiB:,.0f} GiB of host cache to pin × "
            f"{r.pin_s_per_gib:g} s per GiB ({r.source})"
            if c.pinned_new_bytes
            else "no host cache in the new set",
            without_service=True,
        ),
        _load(c),
        Part(
            "probation",
            f.probation_s,
            "probation_s: out of the router until it passes"
            if f.behind_router
            else "probation_s: the new server serves meanwhile",
            without_service=f.behind_router,
        ),
    ]
    return Downtime(tuple(parts), f.behind_router)


def _stop(f: ServerFacts) -> Part:
    if f.behind_router or f.drain_s > 0 or not f.in_flight:
        seconds = SGLANG_DRAIN_LOOK_S
        why = (
            f"SGLang notices the SIGTERM at its next look (every {SGLANG_DRAIN_LOOK_S:g} s) "
            "and exits with nothing in flight"
        )
    else:
        seconds = f.stop_grace_s
        why = (
            f"{f.in_flight:,.0f} requests in flight: SGLang serves on while it drains, up to "
            f"stop_grace_s ({f.stop_grace_s:g} s); what is left then is cut"
        )
    return Part("stop", seconds, why, without_service=True)


def _load(c: ChangeFacts) -> Part:
    f = c.server
    if f.measured_start_s is None:
        return Part(
            "load",
            None,
            "not measured: this daemon did not see the serving server start (the model's "
            "load and warm-up come on top)",
            without_service=True,
        )
    base = max(0.0, f.measured_start_s - f.rates.pin_s(c.pinned_now_bytes))
    how = f"the serving server started in {f.measured_start_s:.1f} s"
    if c.pinned_now_bytes:
        how += f", {base:.1f} s of it besides pinning"
    seconds = base
    if c.weights_ratio is not None and abs(c.weights_ratio - 1) > 0.005:
        seconds = base * c.weights_ratio
        how += f"; × {c.weights_ratio:.2f} for the new set's weights per GPU"
    if c.graphs_now is not None and c.graphs_new is not None and c.graphs_new != c.graphs_now:
        more = c.graphs_new - c.graphs_now
        if f.graph_s_each is not None:
            seconds += more * f.graph_s_each
            how += (
                f"; {more:+d} decode CUDA graphs × {f.graph_s_each:.2f} s each (the serving "
                "server's capture)"
            )
        else:
            how += f"; {more:+d} decode CUDA graphs to capture (not timed here)"
    if c.load_caveat:
        how += f"; {c.load_caveat}"
    return Part("load", max(0.0, seconds), how, without_service=True)
