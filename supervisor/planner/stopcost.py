"""What a stop (and a start) costs with a pinned host cache, and the service's budget.

Exiting with pinned host memory costs ≈0.2 s per pinned GiB, with SIGTERM or SIGKILL
alike (measured on an H200 host: docs/design.md "What a stop costs, measured",
tests/benchmarks/results/gpu_release_h200.md; the unit's comments in
systemd/sglang-supervisor.service). The daemon's own teardown deadline is
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

#: Measured exit cost per pinned GiB (H200 host, docs/design.md).
MEASURED_S_PER_PINNED_GIB = 0.2


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

    def cost(self, pinned_bytes: int) -> dict[str, Any]:
        """What a stop and a start with ``pinned_bytes`` of host cache imply."""
        gib = pinned_bytes / GiB
        deadline = self.deadline_s(pinned_bytes)
        return {
            "pinned_host_gib": round(gib, 1),
            # The server's exit after its drain: ≈0.2 s per pinned GiB (measured).
            "expected_stop_s": round(MEASURED_S_PER_PINNED_GIB * gib, 1),
            "stop_deadline_s": round(deadline, 1),
            "stop_budget_s": self.budget_s,
            "within_stop_budget": deadline <= self.budget_s,
            # Pinning at start is taken to cost what unpinning does (not measured apart);
            # the model load comes on top.
            "expected_pinning_at_start_s": round(MEASURED_S_PER_PINNED_GIB * gib, 1),
        }
