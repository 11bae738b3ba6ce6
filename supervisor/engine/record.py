"""The server record: everything about the server that changes, with one writer.

``ServerRecord`` holds the state (and since when, and why), the levers (current and
last-good), the server in hand, the managed GPUs and their baseline, the restart and
crash counts, probation, the last drain, the router's last error, the warnings, what
start-up is still loading and which SGLang answers. Its fields change only through its
own methods, each named for what happened (``transition``, ``server_started``,
``commit_levers``, ``note_crash``...): ``tests/unit/engine/test_one_writer.py`` fails when
any other module assigns one. Steps that only read take ``ReadRecord`` (properties
only), so mypy rejects a write from them.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from sglang_supervisor.engine.sglang_info import SglangInfo
from sglang_supervisor.engine.sglang_info import before_start as sglang_before_start
from sglang_supervisor.host.backend import ServerHandle
from sglang_supervisor.host.gpu import GpuInfo
from sglang_supervisor.observe.events import EventBus
from sglang_supervisor.observe.telemetry import Throughput
from sglang_supervisor.operations import wall_iso
from sglang_supervisor.redact import remember
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.states import ServerState, check_transition

log = logging.getLogger("supervisor")

TransitionHook = Callable[[ServerState, ServerState, str], None]


@dataclass(frozen=True)
class ServerInfo:
    """The server launch in hand. Frozen: ``ServerRecord.server_ready`` replaces it, so
    no reader can change the record through it."""

    handle: ServerHandle
    levers: LeverSet
    started_at: str = field(default_factory=wall_iso)
    ready_at: str | None = None
    max_total_num_tokens: int | None = None
    #: Spawn → ready, measured by this daemon (None: adopted, or not ready yet): what a
    #: restart of this model takes, for the expected time without service of a change.
    start_s: float | None = None


class ReadRecord(Protocol):
    """The record as read-only steps and readers see it."""

    @property
    def state(self) -> ServerState: ...
    @property
    def state_since(self) -> float: ...
    @property
    def state_reason(self) -> str: ...
    @property
    def levers(self) -> LeverSet: ...
    @property
    def last_good(self) -> LeverSet | None: ...
    @property
    def server(self) -> ServerInfo | None: ...
    @property
    def managed(self) -> Sequence[GpuInfo]: ...
    @property
    def baseline(self) -> Mapping[int, int]: ...
    @property
    def throughput(self) -> Throughput: ...
    @property
    def restarts(self) -> int: ...
    @property
    def restarts_by_reason(self) -> Mapping[str, int]: ...
    @property
    def warnings(self) -> Sequence[str]: ...
    @property
    def sglang(self) -> SglangInfo: ...
    @property
    def loading(self) -> str | None: ...
    @property
    def router_error(self) -> str | None: ...
    @property
    def last_drain_s(self) -> float | None: ...
    @property
    def last_drain_left(self) -> float | None: ...
    @property
    def probation(self) -> Mapping[str, Any] | None: ...
    @property
    def refused_start(self) -> str | None: ...

    def gpu_indices(self) -> list[int]: ...


class ServerRecord:
    """The one mutable record of the server; its methods are its only writers."""

    def __init__(
        self,
        clock: Callable[[], float],
        events: EventBus,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self._clock = clock
        self._events = events
        #: Called at every transition (the /status members cache drops its scan).
        self._on_change = on_change
        #: Called with (old, new, reason) after every transition (the metrics).
        self.on_transition: list[TransitionHook] = []
        self.state = ServerState.LOADING
        self.state_since = clock()
        self.state_reason = "daemon started: loading its state, SGLang's flag schema, the GPUs"
        #: The levers serving (or about to): they change only at commit or rollback.
        self.levers = LeverSet()
        self.last_good: LeverSet | None = None
        #: The launch in hand (recorded before anything else can happen to it).
        self.server: ServerInfo | None = None
        self.managed: list[GpuInfo] = []
        #: Per-GPU memory used with nothing of ours running (NVML index -> bytes).
        self.baseline: dict[int, int] = {}
        self.throughput = Throughput()
        self.restarts = 0
        self.restarts_by_reason: dict[str, int] = {}
        #: When the recent failures happened (the crash-loop window).
        self.crash_times: deque[float] = deque()
        self.warnings: list[str] = []
        #: Why the daemon's own start is refused (a process not ours on a managed GPU),
        #: while start-up retries it (``start_retry.retry_refused_start``); None otherwise.
        self.refused_start: str | None = None
        #: Which SGLang answers validation, and whether its resolution runs (/status).
        self.sglang: SglangInfo = sglang_before_start()
        #: What start-up is still loading, for /status and the 503 of mutating calls
        #: meanwhile; None once the levers to start with are known.
        self.loading: str | None = "the state directory, SGLang's flag schema, the GPUs"
        #: What the last router call that failed said (None after one that worked).
        self.router_error: str | None = None
        #: The last drain before a stop: how long it took and how many requests were
        #: still running or queued at its end (None: unknown or no drain yet).
        self.last_drain_s: float | None = None
        self.last_drain_left: float | None = None
        #: While a new server is on probation: ``{"until", "probes_ok", "pid"}`` (None:
        #: not on probation). /readyz answers 503 meanwhile.
        self.probation: dict[str, Any] | None = None

    def gpu_indices(self) -> list[int]:
        return [g.index for g in self.managed]

    # ---------------------------------------------------------------- the state

    def transition(self, new: ServerState, reason: str) -> None:
        """The one place the state changes: checked, stamped, logged, published."""
        old = self.state
        check_transition(old, new, reason)
        self.state = new
        self._on_change()  # membership changes with the state
        self.state_since = self._clock()
        self.state_reason = reason
        log.info("%s -> %s (%s)", old, new, reason)
        for hook in self.on_transition:
            hook(old, new, reason)
        self._events.publish("transition", old=str(old), new=str(new), reason=reason)

    def warn(self, message: str) -> None:
        """Show ``message`` in /status's warnings (once)."""
        if message not in self.warnings:
            self.warnings.append(message)

    def warning_resolved(self, message: str) -> None:
        """Take ``message`` out of /status's warnings: what it warned of is over."""
        if message in self.warnings:
            self.warnings.remove(message)

    # ------------------------------------------------------------------ levers

    def chose_levers(self, levers: LeverSet, last_good: LeverSet | None) -> None:
        """Start-up chose the levers to start with (and found the last-good set)."""
        self.levers, self.last_good = levers, last_good

    def commit_levers(self, levers: LeverSet) -> None:
        """``levers`` serve (past probation where there was one): current and last-good."""
        self.levers = levers
        self.last_good = levers

    def rolled_back_to(self, good: LeverSet) -> None:
        """The last-good levers serve again (a containment may come from other levers)."""
        self.levers = good

    # -------------------------------------------------------------- the server

    def server_started(self, server: ServerInfo) -> None:
        """A launch (or an adopted one) is in hand: a shutdown's teardown finds it. Its
        secret values are hidden from now on wherever they appear (its log prints them)."""
        remember(server.levers.levers, server.levers.env)
        self.server = server
        self.refused_start = None

    def start_refused(self, why: str | None) -> None:
        """The daemon's own start is refused (``why``, which the state's reason says: the
        state itself stays ``stopped``), or no longer (None)."""
        self.refused_start = why
        if why is not None:
            self.state_reason = why
            log.warning("%s", why)

    def server_ready(self, max_total_num_tokens: int | None, start_s: float | None = None) -> None:
        """The server in hand answered /health_generate (and maybe /server_info), after
        ``start_s`` from its spawn (None: not timed, an adopted server)."""
        assert self.server is not None
        self.server = replace(
            self.server,
            ready_at=wall_iso(),
            max_total_num_tokens=max_total_num_tokens,
            start_s=start_s,
        )

    def changed_in_place(self, levers: LeverSet) -> None:
        """The server in hand serves ``levers`` now, changed without a restart (live, or
        new weights): same launch, same pid."""
        assert self.server is not None
        self.server = replace(self.server, levers=levers)

    def server_gone(self) -> None:
        """The server was torn down (its GPUs' release is judged apart)."""
        self.server = None

    def gpus_resolved(self, managed: Sequence[GpuInfo]) -> None:
        """Start-up resolved the managed GPUs."""
        self.managed = list(managed)

    def baseline_measured(self, baseline: Mapping[int, int]) -> None:
        """GPU memory in use with nothing of ours running (empty: not measured yet)."""
        self.baseline = dict(baseline)

    def throughput_read(self, throughput: Throughput) -> None:
        self.throughput = throughput

    # ------------------------------------------------------------ crashes, restarts

    def crash_seen(self, kind: str) -> None:
        """The watcher saw the ready server crash or hang (``kind``)."""
        self.restarts_by_reason[kind] = self.restarts_by_reason.get(kind, 0) + 1

    def note_crash(self, now: float, window_s: float) -> int:
        """A failure at ``now``; returns how many fell within the last ``window_s``."""
        self.crash_times.append(now)
        while self.crash_times and self.crash_times[0] < now - window_s:
            self.crash_times.popleft()
        return len(self.crash_times)

    def crashes_forgiven(self) -> None:
        """An operator's successful change starts the crash-loop count afresh."""
        self.crash_times.clear()

    def recovered(self) -> None:
        """A recovery brought the server back."""
        self.restarts += 1

    def crash_history(self, now: float, wall_now: float) -> tuple[int, dict[str, int], list[float]]:
        """Restarts, restarts by reason and the recent failures as unix times (``now`` is
        this record's clock, ``wall_now`` the unix time), for the journal."""
        recent = [wall_now - (now - t) for t in self.crash_times]
        return self.restarts, dict(self.restarts_by_reason), recent

    def crashes_restored(
        self, restarts: int, by_reason: Mapping[str, int], recent: Iterable[float], now: float
    ) -> None:
        """What an earlier daemon counted (the journal): the restarts go on from there,
        and its failures (this record's clock, ``now`` the moment of the restore) stay in
        the crash-loop window."""
        self.restarts = restarts
        self.restarts_by_reason = {str(k): int(v) for k, v in by_reason.items()}
        self.crash_times = deque(sorted(t for t in recent if t <= now))

    # ---------------------------------------------------------------- probation

    def probation_began(self, until: str, pid: int) -> None:
        self.probation = {"until": until, "probes_ok": 0, "pid": pid}

    def probation_probe_ok(self, probes_ok: int) -> None:
        assert self.probation is not None
        self.probation = {**self.probation, "probes_ok": probes_ok}

    def probation_ended(self) -> None:
        self.probation = None

    # ----------------------------------------------------- router, drain, SGLang

    def router_answered(self, error: str | None) -> None:
        """The router's last call: None when it worked, else what it said."""
        self.router_error = error

    def drained(self, duration_s: float, left: float | None) -> None:
        self.last_drain_s, self.last_drain_left = duration_s, left

    def sglang_learned(self, info: SglangInfo) -> None:
        """What is known now of the SGLang that answers validation."""
        self.sglang = info

    def loading_now(self, what: str | None) -> None:
        """What start-up is loading now (None: done)."""
        self.loading = what
