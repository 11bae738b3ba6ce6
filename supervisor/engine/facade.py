"""The ``Supervisor``'s read-only face: what the API, the metrics and the tests read of it,
delegated to its ``Parts`` (fixed at construction) and its ``ServerRecord`` (changed by
the record's own methods only). Nothing here can be assigned.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sglang_supervisor.config import Settings
from sglang_supervisor.engine.journal import Journal
from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ServerInfo, ServerRecord, TransitionHook
from sglang_supervisor.engine.registry import OperationRegistry
from sglang_supervisor.engine.sglang_info import SglangInfo
from sglang_supervisor.host.backend import Backend, ProcessOps
from sglang_supervisor.host.gpu import GpuInfo, GpuProbe
from sglang_supervisor.observe.events import EventBus
from sglang_supervisor.observe.health import HealthChecker
from sglang_supervisor.observe.telemetry import Throughput
from sglang_supervisor.operations import Operation
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.sglang.router import WorkerLink
from sglang_supervisor.sglang.schema import FlagSchema
from sglang_supervisor.states import ServerState
from sglang_supervisor.store import Store


class SupervisorReads:
    """Read-only properties over ``parts`` and ``record``."""

    parts: Parts
    record: ServerRecord
    ops: OperationRegistry

    @property
    def operation(self) -> Operation | None:
        """The running operation (None: none runs)."""
        return self.ops.current

    @property
    def operations(self) -> dict[str, Operation]:
        """The kept operations by id, oldest first."""
        return self.ops.kept

    @property
    def on_operation_end(self) -> list[Callable[[Operation], None]]:
        """Hooks called with each operation that ends (the metrics' histograms)."""
        return self.ops.on_end

    @property
    def on_transition(self) -> list[TransitionHook]:
        """Hooks called with (old, new, reason) after each transition (the metrics)."""
        return self.record.on_transition

    @property
    def settings(self) -> Settings:
        return self.parts.settings

    @property
    def backend(self) -> Backend:
        return self.parts.backend

    @property
    def procs(self) -> ProcessOps:
        return self.parts.procs

    @property
    def health(self) -> HealthChecker:
        return self.parts.health

    @property
    def journal(self) -> Journal:
        return self.parts.journal

    @property
    def router(self) -> WorkerLink:
        return self.parts.router

    @property
    def events(self) -> EventBus:
        return self.parts.events

    @property
    def clock(self) -> Callable[[], float]:
        return self.parts.clock

    @property
    def poll_s(self) -> float:
        return self.parts.poll_s

    @property
    def tag_prefix(self) -> str:
        return self.parts.tag_prefix

    @property
    def probe(self) -> GpuProbe:
        return self.parts.probe

    @property
    def schema(self) -> FlagSchema:
        return self.parts.schema

    @property
    def schema_live(self) -> bool:
        return self.parts.schema_live

    @property
    def schema_warning(self) -> str | None:
        return self.parts.schema_warning

    @property
    def store(self) -> Store:
        return self.parts.store

    @property
    def url(self) -> str:
        return self.parts.url

    @property
    def state(self) -> ServerState:
        return self.record.state

    @property
    def state_since(self) -> float:
        return self.record.state_since

    @property
    def state_reason(self) -> str:
        return self.record.state_reason

    @property
    def levers(self) -> LeverSet:
        return self.record.levers

    @property
    def last_good(self) -> LeverSet | None:
        return self.record.last_good

    @property
    def server(self) -> ServerInfo | None:
        return self.record.server

    @property
    def managed(self) -> Sequence[GpuInfo]:
        return self.record.managed

    @property
    def baseline(self) -> Mapping[int, int]:
        return self.record.baseline

    @property
    def throughput(self) -> Throughput:
        return self.record.throughput

    @property
    def restarts(self) -> int:
        return self.record.restarts

    @property
    def restarts_by_reason(self) -> Mapping[str, int]:
        return self.record.restarts_by_reason

    @property
    def crash_times(self) -> Sequence[float]:
        return self.record.crash_times

    @property
    def warnings(self) -> Sequence[str]:
        return self.record.warnings

    @property
    def sglang(self) -> SglangInfo:
        return self.record.sglang

    @property
    def loading(self) -> str | None:
        return self.record.loading

    @property
    def router_error(self) -> str | None:
        return self.record.router_error

    @property
    def probation(self) -> Mapping[str, Any] | None:
        return self.record.probation

    def gpu_indices(self) -> list[int]:
        return self.record.gpu_indices()
