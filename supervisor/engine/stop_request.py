"""The daemon's request to stop, apart from the server's state: whether a shutdown was
asked for, whether it is forced, and until when a drain in progress may run.

The steps read it (``checkpoint``, the drain, the teardown's grace period, the budget
the daemon's stop waits for); only ``Supervisor.request_shutdown`` asks, only the drain
sets its deadline. It changes nothing by itself: the running operation notices it at its
next phase boundary or poll.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StopRequest:
    """A shutdown asked for (graceful, then forced), and the drain's deadline."""

    #: Set by the first shutdown request: operations end at their next phase boundary
    #: and no new one starts.
    requested: bool = False
    #: Set by a second request (or a forced one): no drain, SIGKILL without a grace period.
    forced: bool = False
    #: When a drain in progress ends at the latest (None: no drain).
    drain_deadline: float | None = None

    def request(self, *, force: bool = False) -> bool:
        """Record a request: the first is graceful, a second one (or ``force``) forces.
        Returns True when this call is the one that forced it."""
        forcing = (self.requested or force) and not self.forced
        if forcing:
            self.forced = True
        self.requested = True
        return forcing

    def is_forced(self) -> bool:
        """``forced``, as a callable (the teardown's worker thread polls it)."""
        return self.forced

    def drain_left(self, now: float) -> float:
        """The seconds a drain in progress may still take (0 when forced or none runs)."""
        if self.drain_deadline is None or self.forced:
            return 0.0
        return max(0.0, self.drain_deadline - now)
