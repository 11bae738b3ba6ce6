"""Operation records: one apply / stop / start / restart / recover, with its phases.

An operation ends ``succeeded``, ``rolled_back`` (the new levers failed, the last-good
ones serve again) or ``failed`` (it could not get back to a serving state).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sglang_supervisor.phases import OUTCOMES, OpState, PhaseName, base_phase

RUNNING = OpState.RUNNING
SUCCEEDED = OpState.SUCCEEDED
ROLLED_BACK = OpState.ROLLED_BACK
FAILED = OpState.FAILED
__all__ = ["FAILED", "OUTCOMES", "ROLLED_BACK", "RUNNING", "SUCCEEDED", "Operation", "Phase"]


def wall_iso(ts: float | None = None) -> str:
    """An ISO-8601 UTC timestamp for display (deadlines never use the wall clock)."""
    return datetime.fromtimestamp(time.time() if ts is None else ts, UTC).isoformat(
        timespec="milliseconds"
    )


@dataclass
class Phase:
    name: str
    state: str = RUNNING
    started_at: str = field(default_factory=wall_iso)
    ended_at: str | None = None
    detail: str = ""
    _t0: float = field(default_factory=time.monotonic, repr=False)
    duration_s: float | None = None
    _notify: Callable[[Phase], None] | None = field(default=None, repr=False)

    def end(self, state: str, detail: str = "") -> None:
        self.state = state
        self.ended_at = wall_iso()
        if self.duration_s is None:
            self.duration_s = time.monotonic() - self._t0
        if detail:
            self.detail = detail
        if self._notify is not None:
            self._notify(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "duration_s": None if self.duration_s is None else round(self.duration_s, 4),
            "detail": self.detail,
        }


@dataclass
class Operation:
    kind: str
    levers_requested: dict[str, Any] | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    state: str = RUNNING
    phases: list[Phase] = field(default_factory=list)
    error: str | None = None
    #: Why the new levers were judged failed (set when the operation rolled back).
    rollback_reason: str | None = None
    #: The failed launch's last log lines, when a start failed.
    log_tail: list[str] = field(default_factory=list)
    levers_effective: dict[str, Any] | None = None
    #: The levers serving when an apply was asked for: its lever diff is this -> requested.
    levers_before: dict[str, Any] | None = None
    dry_run: bool = False
    #: The values SGLang's own resolution picked for the requested levers (validate).
    resolved: dict[str, Any] = field(default_factory=dict)
    #: Checks of the validate phase that did not run here: ``{"check", "reason"}`` each.
    not_run: list[dict[str, str]] = field(default_factory=list)
    #: An apply's way to the server: "live", "weights" or "restart" (None: not chosen,
    #: or nothing to change), and why (``sglang_supervisor.sglang.live``).
    path: str | None = None
    path_reason: str | None = None
    #: An apply's expected time without service, part by part, estimated before the stop
    #: (``sglang_supervisor.planner.downtime``); None: nothing is restarted.
    expected_downtime: dict[str, Any] | None = None
    #: Set once the supervisor has counted and announced the operation's end.
    reported: bool = field(default=False, repr=False)
    created_at: str = field(default_factory=wall_iso)
    ended_at: str | None = None
    #: The same instants as Unix times (the load history's clock).
    created_unix: float = field(default_factory=time.time, repr=False)
    ended_unix: float | None = field(default=None, repr=False)
    #: An apply's measured effect (``observe.effect``): the server over a window after
    #: it beside the same window before it, and the verdict; None until it commits.
    effect: dict[str, Any] | None = None
    _t0: float = field(default_factory=time.monotonic, repr=False)
    duration_s: float | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    #: Called with each phase as it starts and ends (the event stream).
    listener: Callable[[Operation, dict[str, Any]], None] | None = field(default=None, repr=False)
    #: Called once it has finished, before anyone waiting on ``done`` wakes (the
    #: registry counts and announces it there, so an answer never precedes its count).
    on_end: Callable[[Operation], None] | None = field(default=None, repr=False)
    #: An operator's request to end it early, until honoured at the next phase boundary.
    cancel_requested: str | None = field(default=None, repr=False)
    #: The cancel request once it was honoured (the operation then rolls back or fails).
    cancelled: str | None = field(default=None, repr=False)
    #: Why an operator's cancel is refused now (None: it may be cancelled): set once a
    #: rollback or containment has begun, which a cancel would only turn into an outage.
    not_cancellable: str | None = field(default=None, repr=False)
    #: Set by a cancel or shutdown request: the operation's waits end early to notice it.
    wake: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def finished(self) -> bool:
        return self.state != RUNNING

    def phase(self, name: str) -> Phase:
        ph = Phase(name, _notify=self._notify)
        self.phases.append(ph)
        self._notify(ph)
        return ph

    def _notify(self, phase: Phase) -> None:
        if self.listener is not None:
            self.listener(self, phase.to_json())

    def finish(self, state: str, error: str | None = None) -> None:
        assert state in OUTCOMES, state
        late, self.cancel_requested = self.cancel_requested, None
        if late is not None:
            # Accepted, then no phase boundary came (the start was past its last wait):
            # the operator reads that it was too late, never a silent success.
            self.phase(PhaseName.CANCEL).end(
                FAILED,
                f"{late}, after the operation's last step that could end it: not honoured; "
                f"the operation ended {state}",
            )
        self.state = state
        if error is not None:
            self.error = error
        self.ended_unix = time.time()
        self.ended_at = wall_iso(self.ended_unix)
        self.duration_s = time.monotonic() - self._t0
        for ph in self.phases:
            if ph.state == RUNNING:
                ph.end(FAILED, "interrupted")
        if self.on_end is not None:
            self.on_end(self)
        self.done.set()

    def downtime(self, now: float | None = None) -> dict[str, Any] | None:
        """The time without service it caused: from each stop (``stop``,
        ``rollback_stop``...) to the next start that ended ready, summed; an interval
        still open runs to ``now`` (monotonic) while it runs, to its end once it ended
        with nothing serving. None: it stopped nothing."""
        intervals: list[dict[str, Any]] = []
        down: Phase | None = None
        for ph in self.phases:
            kind = base_phase(ph.name)
            if kind is PhaseName.STOP and down is None:
                down = ph
            elif kind is PhaseName.START and down is not None and ph.state == SUCCEEDED:
                end = ph._t0 + (ph.duration_s or 0.0)
                intervals.append(_interval(down, ph.name, end - down._t0))
                down = None
        if down is not None:
            if self.finished:
                end = self._t0 + (self.duration_s or 0.0)
            else:
                end = time.monotonic() if now is None else now
            intervals.append(_interval(down, None, end - down._t0))
        if not intervals:
            return None
        return {
            "seconds": round(sum(i["seconds"] for i in intervals), 3),
            "serving_again": down is None,
            "intervals": intervals,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "state": self.state,
            "dry_run": self.dry_run,
            "resolved": self.resolved,
            "not_run": self.not_run,
            "created_at": self.created_at,
            "ended_at": self.ended_at,
            "duration_s": None if self.duration_s is None else round(self.duration_s, 4),
            "phases": [p.to_json() for p in self.phases],
            "error": self.error,
            "rollback_reason": self.rollback_reason,
            "log_tail": self.log_tail,
            "levers_requested": self.levers_requested,
            "levers_effective": self.levers_effective,
            "levers_before": self.levers_before,
            "not_cancellable": self.not_cancellable,
            "path": self.path,
            "path_reason": self.path_reason,
            "expected_downtime": self.expected_downtime,
            "downtime": self.downtime(),
            "effect": self.effect,
        }


def _interval(stop: Phase, ready: str | None, seconds: float) -> dict[str, Any]:
    """One stretch without service: from ``stop`` to the ``ready`` start phase (None:
    nothing became ready)."""
    return {"from": stop.name, "to": ready, "seconds": round(max(0.0, seconds), 3)}
