"""What a stop (and a start) costs with a pinned host cache, and the service's budget.

Measured on an H200 host (``tests/benchmarks/results/h200_teardown.md`` and its raw
records ``h200_teardown*.json``: one process pinning the case's host memory with torch's
``pin_memory``, 2 runs × 2 calls per size):

- **unpinning** — exiting with pinned host memory, SIGTERM or SIGKILL alike — costs
  ≈0.2 s per pinned GiB: 48 GiB → 9.0 s (8.6–9.5) from SIGKILL to NVML showing the GPU
  free, 8 GiB → 1.5 s (0.19 s/GiB both);
- **pinning** at start costs ≈0.58 s per GiB: 48 GiB took 24.9–39.5 s (median 28.0 s of
  8 runs), 8 GiB 2.9–4.1 s (0.38 s/GiB: the larger pool is the figure for a host cache).
  SGLang 0.5.23 pins its pool with ``cudaHostRegister`` over a plain allocation
  (``mem_cache/pool_host/common.py:143-190``, ``alloc_with_host_register``), not with
  torch's ``pin_memory`` (``cudaHostAlloc``): the same page faults and pinning, not
  measured apart.

Both were measured for one process; a node's ranks are taken to pin and unpin one after
another (the node's total at the rate), an upper bound where they overlap. They do:
SGLang's own path (``tests/benchmarks/h200_pinning.py``, results ``h200_pinning.json``)
costs 0.52 s per GiB in one process at 48 GiB, but eight ranks pin the node's 48 GiB in
4.6-6.0 s, so for eight ranks this bound is 4-5x over (about 2x at 8 GiB).
``PinRates`` carries the figures; the simulated backend passes its own (``[sim]``
``pin_s_per_gib``, ``unpin_s_per_gib``: these by default). The daemon's own teardown deadline is
``stop_grace_s + kill_timeout_s + release_timeout_s + release_s_per_pinned_gib × GiB``
(``sglang_supervisor.engine.release.teardown_budget``), and the unit's ``TimeoutStopSec`` must
cover it, or systemd SIGKILLs the daemon in the middle of verifying the release
(docs/systemd.md). ``[timeouts] stop_budget_s`` is that ``TimeoutStopSec`` (360 in the
shipped unit): the plan keeps its proposal's deadline within it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_supervisor.units import GiB

#: Measured exit cost per pinned GiB (H200 host; module docstring).
MEASURED_S_PER_PINNED_GIB = 0.2
#: Measured cost of pinning one GiB at start (H200 host, 48 GiB; module docstring).
MEASURED_PIN_S_PER_GIB = 0.58
#: Where those figures come from, for the plan's and the operation's words.
MEASURED_ON = "measured on an H200 host, tests/benchmarks/results/h200_teardown.md"


@dataclass(frozen=True)
class PinRates:
    """Seconds per GiB of host pool to pin at start and to unpin at stop, and whence."""

    pin_s_per_gib: float = MEASURED_PIN_S_PER_GIB
    unpin_s_per_gib: float = MEASURED_S_PER_PINNED_GIB
    source: str = MEASURED_ON

    def pin_s(self, pinned_bytes: int) -> float:
        return self.pin_s_per_gib * pinned_bytes / GiB

    def unpin_s(self, pinned_bytes: int) -> float:
        return self.unpin_s_per_gib * pinned_bytes / GiB


#: The H200 figures.
MEASURED_RATES = PinRates()


@dataclass(frozen=True)
class StopBudget:
    """The daemon's stop deadlines and the service's budget for a whole stop."""

    budget_s: float
    stop_grace_s: float
    kill_timeout_s: float
    release_timeout_s: float
    release_s_per_pinned_gib: float

    @property
    def fixed_s(self) -> float:
        return self.stop_grace_s + self.kill_timeout_s + self.release_timeout_s

    def deadline_s(self, pinned_bytes: int) -> float:
        """The daemon's own teardown deadline with ``pinned_bytes`` of host cache."""
        return self.fixed_s + self.release_s_per_pinned_gib * pinned_bytes / GiB

    def max_pinned_bytes(self) -> int | None:
        """The most pinned host memory whose teardown deadline fits the budget (None: no
        limit, the release is not slowed per GiB)."""
        if self.release_s_per_pinned_gib <= 0:
            return None
        return max(0, int((self.budget_s - self.fixed_s) / self.release_s_per_pinned_gib * GiB))

    def cost(self, pinned_bytes: int, rates: PinRates = MEASURED_RATES) -> dict[str, Any]:
        """What a stop and a start with ``pinned_bytes`` of host cache imply."""
        deadline = self.deadline_s(pinned_bytes)
        return {
            "pinned_host_gib": round(pinned_bytes / GiB, 1),
            # The server's exit after its drain: unpinning (≈0.2 s per GiB, measured).
            "expected_stop_s": round(rates.unpin_s(pinned_bytes), 1),
            "stop_deadline_s": round(deadline, 1),
            "stop_budget_s": self.budget_s,
            "within_stop_budget": deadline <= self.budget_s,
            # Pinning at start (≈0.58 s per GiB, measured); the model load comes on top.
            "expected_pinning_at_start_s": round(rates.pin_s(pinned_bytes), 1),
            "rates": {
                "pin_s_per_gib": rates.pin_s_per_gib,
                "unpin_s_per_gib": rates.unpin_s_per_gib,
                "source": rates.source,
            },
        }
