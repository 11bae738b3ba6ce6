"""A frozen snapshot of the supervisor: what routes, metrics and ``/plan`` read.

``Supervisor.view()`` builds one on the event loop in microseconds; readers never reach
into the supervisor's attributes, so they can never see (or cause) a half-made change.
GPU memory is not in the view: it is sampled when asked (``Supervisor.status()``, the
metrics' scrape-time collector).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sglang_supervisor.engine.desired import DesiredView
from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ReadRecord
from sglang_supervisor.engine.registry import OperationRegistry
from sglang_supervisor.engine.release import members_now
from sglang_supervisor.engine.server import serving_cache_dir
from sglang_supervisor.host.gpu import GpuInfo, GpuQueryError
from sglang_supervisor.observe.history import Sample
from sglang_supervisor.observe.telemetry import Throughput
from sglang_supervisor.operations import Operation
from sglang_supervisor.planner.diagnosis import Diagnosis
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.sglang.schema import FlagSchema
from sglang_supervisor.states import ServerState

_EMPTY: Mapping[Any, Any] = MappingProxyType({})


def frozen_map(data: Mapping[Any, Any]) -> Mapping[Any, Any]:
    """A read-only copy of ``data``."""
    return MappingProxyType(dict(data)) if data else _EMPTY


@dataclass(frozen=True)
class ServerView:
    """The server launch the supervisor is watching."""

    pid: int
    url: str
    started_at: str
    ready_at: str | None
    max_total_num_tokens: int | None
    launch_tag: str
    log_path: Path
    levers: LeverSet
    #: Spawn → ready, measured by this daemon (None: adopted).
    start_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "url": self.url,
            "started_at": self.started_at,
            "ready_at": self.ready_at,
            "max_total_num_tokens": self.max_total_num_tokens,
            "launch_tag": self.launch_tag,
            "log_path": str(self.log_path),
            "start_s": None if self.start_s is None else round(self.start_s, 3),
        }


@dataclass(frozen=True)
class SupervisorView:
    """Everything about the supervisor a reader may look at, as of one instant."""

    state: ServerState
    state_reason: str
    #: Seconds in ``state`` when the view was made.
    state_for_s: float
    #: "sglang" or "simulated".
    backend: str
    #: The backend's extra environment for every launch.
    backend_env: Mapping[str, str]
    #: The simulated host's RAM (None: the real host's is read).
    simulated_host_ram_bytes: int | None
    server: ServerView | None
    #: The levers serving (or about to), and the last set proven to serve.
    levers: LeverSet
    last_good: LeverSet | None
    managed: tuple[GpuInfo, ...]
    #: Per-GPU memory used with nothing of ours running (NVML index -> bytes).
    baseline: Mapping[int, int]
    gpu_probe_kind: str
    pids_are_local: bool
    #: The running operation and the last one that ended, as their JSON.
    operation: Mapping[str, Any] | None
    last_operation: Mapping[str, Any] | None
    restarts: int
    restarts_by_reason: Mapping[str, int]
    #: Finished operations by (kind, outcome).
    operation_counts: Mapping[tuple[str, str], int]
    #: Unix time of the last apply that succeeded.
    last_apply_success_time: float | None
    throughput: Throughput
    schema: FlagSchema
    #: Whether SGLang's own parser (in server.python) validates levers too.
    schema_live: bool
    warnings: tuple[str, ...]
    logs_dir: Path
    #: The sglang-router in front of the server: ``url``, ``worker_url``, ``registered``
    #: (True/False as last seen, None unknown), ``error``; None without [router].
    router: Mapping[str, Any] | None = None
    #: The last drain before a stop: seconds, and requests left at its end.
    last_drain_s: float | None = None
    last_drain_left: float | None = None
    #: ``{"until", "probes_ok", "pid"}`` while a new server is on probation, else None.
    probation: Mapping[str, Any] | None = None
    #: What start-up is still loading (None: done).
    loading: str | None = None
    #: Which SGLang answers validation (``SglangInfo.to_json``).
    sglang: Mapping[str, Any] | None = None
    #: The load's diagnosis and its last hour (planner.diagnosis, observe.history).
    diagnosis: Diagnosis | None = None
    history: tuple[Sample, ...] = ()
    #: The config's levers, the desired state (``engine/desired.py``: drift, reconcile).
    desired: DesiredView | None = None
    #: The server's SGLANG_CACHE_DIR and its size as last measured (observe/cachedir.py).
    sglang_cache: Mapping[str, Any] | None = None
    #: The last apply's measured effect (``observe/effect.py``) with its ``operation``
    #: id, measuring or judged; and the effects judged so far, by verdict.
    effect: Mapping[str, Any] | None = None
    effect_counts: Mapping[str, int] = field(default_factory=dict)
    #: The slurm launcher's own status (``SlurmProcessOps.status_json``); None elsewhere.
    slurm: Mapping[str, Any] | None = None
    #: Why the daemon's own start is refused while start-up retries it (None: it is not).
    start_refused: str | None = None

    @property
    def gpu_indices(self) -> list[int]:
        return [g.index for g in self.managed]

    def status_json(self, gpus: list[dict[str, Any]]) -> dict[str, Any]:
        """``GET /status``: this view with ``gpus`` (sampled by the caller)."""
        last = self.last_operation
        return {
            "state": str(self.state),
            "state_reason": self.state_reason,
            "state_for_s": round(self.state_for_s, 3),
            "backend": self.backend,
            "server": None if self.server is None else self.server.to_json(),
            "levers": dict(self.levers.levers),
            "env": dict(self.levers.env),
            "last_good_levers": None if self.last_good is None else self.last_good.to_json(),
            "gpus": gpus,
            # A server spanning Slurm nodes: its GPUs node by node (supervisor/slurm/).
            **({"nodes": nodes} if (nodes := nodes_of(gpus)) else {}),
            "gpu_probe": {"kind": self.gpu_probe_kind, "pids_are_local": self.pids_are_local},
            "operation": None if self.operation is None else dict(self.operation),
            "last_operation": None
            if last is None
            else {
                **{k: last[k] for k in ("id", "kind", "state", "error", "ended_at")},
                # What SGLang's resolution made of that operation's levers (validate).
                "resolved": last.get("resolved") or {},
                # The validate phase's checks that did not run, each with why.
                "not_run": last.get("not_run") or [],
            },
            "restarts": self.restarts,
            "restarts_by_reason": dict(self.restarts_by_reason),
            "throughput": self.throughput.to_json(),
            "diagnosis": None if self.diagnosis is None else self.diagnosis.to_json(),
            "schema": {"sglang_version": self.schema.sglang_version, "source": self.schema.source},
            "loading": self.loading,
            "sglang": None if self.sglang is None else dict(self.sglang),
            "warnings": list(self.warnings),
            "router": None if self.router is None else dict(self.router),
            "last_drain": None
            if self.last_drain_s is None
            else {"duration_s": round(self.last_drain_s, 3), "requests_left": self.last_drain_left},
            "probation": None if self.probation is None else dict(self.probation),
            "sglang_cache": None if self.sglang_cache is None else dict(self.sglang_cache),
            "effect": None if self.effect is None else dict(self.effect),
            # The daemon's start refused by a process not ours on a GPU, retried meanwhile.
            "start_refused": self.start_refused,
            # The allocation, the per-node presence and the steps it made (docs/slurm.md).
            **({"slurm": dict(self.slurm)} if self.slurm is not None else {}),
            # drift (config vs serving) and levers_config: engine/desired.py
            **(
                {}
                if self.desired is None
                else self.desired.status_json(
                    self.levers, self.schema, None if self.server is None else self.server.pid
                )
            ),
        }


def nodes_of(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``/status``'s ``nodes``: each Slurm node of the GPU table, in order, with its GPUs'
    indices and memory; empty when no GPU names a node (a one-host server)."""
    nodes: dict[str, dict[str, Any]] = {}
    for g in gpus:
        name = g.get("node")
        if not name:
            continue
        node = nodes.setdefault(
            name, {"name": name, "gpus": [], "memory_used_bytes": 0, "memory_total_bytes": 0}
        )
        node["gpus"].append(g["index"])
        for key in ("memory_used_bytes", "memory_total_bytes"):
            node[key] += g.get(key) or 0
        if "sample_age_s" in g:  # the node's last sample (supervisor/slurm/probe.py)
            node["sample_age_s"] = max(node.get("sample_age_s", 0.0), g["sample_age_s"])
    return list(nodes.values())


def snapshot(parts: Parts, record: ReadRecord, ops: OperationRegistry) -> SupervisorView:
    """The view now (call it on the event loop)."""
    server = record.server
    backend = parts.backend
    return SupervisorView(
        state=record.state,
        state_reason=record.state_reason,
        state_for_s=max(0.0, parts.clock() - record.state_since),
        backend=backend.name,
        backend_env=frozen_map(backend.env),
        simulated_host_ram_bytes=backend.simulated_host_ram_bytes,
        server=None
        if server is None
        else ServerView(
            pid=server.handle.pid,
            url=parts.url,
            started_at=server.started_at,
            ready_at=server.ready_at,
            max_total_num_tokens=server.max_total_num_tokens,
            launch_tag=server.handle.tag,
            log_path=server.handle.log_path,
            levers=server.levers,
            start_s=server.start_s,
        ),
        levers=record.levers,
        last_good=record.last_good,
        managed=tuple(record.managed),
        baseline=frozen_map(record.baseline),
        gpu_probe_kind=parts.probe.kind,
        pids_are_local=parts.probe.pids_are_local(),
        operation=None if ops.current is None else ops.current.to_json(),
        last_operation=None if ops.last is None else ops.last.to_json(),
        restarts=record.restarts,
        restarts_by_reason=frozen_map(record.restarts_by_reason),
        operation_counts=frozen_map(ops.counts),
        last_apply_success_time=ops.last_apply_success_time,
        throughput=record.throughput,
        schema=parts.schema,
        schema_live=parts.schema_live,
        warnings=tuple(record.warnings),
        logs_dir=parts.journal.logs_dir,
        router=None
        if not parts.router.enabled
        else frozen_map(
            {
                "url": parts.settings.router.url,
                "worker_url": parts.router.worker_url,
                "registered": parts.router.registered,
                "error": record.router_error,
            }
        ),
        last_drain_s=record.last_drain_s,
        last_drain_left=record.last_drain_left,
        probation=None if record.probation is None else frozen_map(record.probation),
        loading=record.loading,
        sglang=frozen_map(record.sglang.to_json()),
        diagnosis=parts.diagnoser.current,
        history=parts.history.samples,
        desired=parts.desired.view(),
        sglang_cache=_cache_json(parts, record),
        effect=effect_view(parts.effects.last),
        effect_counts=frozen_map(parts.effects.counts),
        slurm=None
        if (launcher := getattr(parts.procs, "status_json", None)) is None
        else launcher(),
        start_refused=record.refused_start,
    )


def _cache_json(parts: Parts, record: ReadRecord) -> Mapping[str, Any]:
    """Where the server's compiled kernels are kept, and their size as last measured."""
    path = str(serving_cache_dir(parts, record.levers))
    last = parts.cache_usage.last
    if last is not None and last.path == path:
        return frozen_map(last.to_json())
    return frozen_map(
        {
            "path": path,
            "bytes": None,
            "files": None,
            "complete": None,
            "measured_at": None,
            "error": None,
        }
    )


def effect_view(op: Operation | None) -> Mapping[str, Any] | None:
    """``/status``'s ``effect``: the last measured apply's effect, with its id."""
    if op is None or op.effect is None:
        return None
    return frozen_map({"operation": op.id, **op.effect})


class MembersCache:
    """Members for display (/status): a full /proc scan costs milliseconds, so one scan
    serves every request within ``max_age_s``; every transition drops it. Teardown never
    uses this.

    Read, written and dropped on the event loop only (the scan runs in a worker thread):
    a scan that a transition overtook is shown once but never kept, so no request after
    the transition is answered with the membership from before it."""

    def __init__(self) -> None:
        self._at: float | None = None
        self._pids: set[int] = set()
        #: Bumped by every ``drop``: a scan begun before it is not kept.
        self._generation = 0

    def drop(self) -> None:
        self._at = None
        self._generation += 1

    async def get(self, parts: Parts, record: ReadRecord, max_age_s: float = 1.0) -> set[int]:
        now = parts.clock()
        if self._at is not None and now - self._at <= max_age_s:
            return self._pids
        generation = self._generation
        pids = await asyncio.to_thread(members_now, parts, record)
        if generation == self._generation:
            self._at, self._pids = now, pids
        return pids


async def gpu_status(
    parts: Parts, record: ReadRecord, members_cache: MembersCache
) -> list[dict[str, Any]]:
    """``/status``'s ``gpus``: memory, baseline and processes (ours or not) per GPU."""
    errors: Mapping[int, str] = {}
    recent = getattr(parts.probe, "recent", None)
    if recent is not None:
        # A probe across Slurm nodes answers from each node's last sample, with its age:
        # /status never waits on a node (supervisor/slurm/probe.py).
        got = recent(record.gpu_indices())
        samples, members, errors = got.samples, got.members, got.errors
    else:
        try:
            samples = await asyncio.to_thread(parts.probe.sample, record.gpu_indices())
            members = await members_cache.get(parts, record)
        except GpuQueryError as exc:
            return [{"index": g.index, "uuid": g.uuid, "error": str(exc)} for g in record.managed]
    uuids = {g.index: g.uuid for g in record.managed}
    entries: dict[int, dict[str, Any]] = {
        i: {"index": i, "uuid": uuids.get(i), "error": why} for i, why in errors.items()
    }
    entries.update(
        (
            s.index,
            {
                "index": s.index,
                "uuid": s.uuid,
                "name": s.name,
                "memory_used_bytes": s.memory_used_bytes,
                "memory_total_bytes": s.memory_total_bytes,
                "baseline_bytes": record.baseline.get(s.index),
                "processes": [
                    {"pid": p.pid, "used_bytes": p.used_bytes, "member": p.pid in members}
                    for p in s.processes
                ],
                # The Slurm node of a server spanning hosts (supervisor/slurm/probe.py).
                **({"node": s.node} if s.node else {}),
                **({"sample_age_s": round(s.age_s, 3)} if s.age_s is not None else {}),
            },
        )
        for s in samples
    )
    return [entries[i] for i in record.gpu_indices() if i in entries]
