"""Simulated GPUs: a ``GpuProbe`` over the registry the simulated server's ranks write.

Each rank of ``sglang_supervisor.sim.server`` writes ``<registry>/<pid>.json`` =
``{"pid", "create_time", "gpu_uuid", "bytes"}`` (atomically, tmp + ``os.replace``). A GPU's
used memory is its baseline plus the bytes of every registered pid that is alive, not a
zombie and (when the entry records a create time) not a reused pid. So memory is "freed"
when the process holding it exits, never when a file is removed — as with a real driver;
an entry with ``held_until`` (unix time) stays held until then after its process is gone,
listed under no process (a rank's exit unpinning its host pool: ``sim.rank``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from sglang_supervisor.host.gpu import GpuInfo, GpuProcess, GpuQueryError, GpuSample

SIM_GPU_NAME = "NVIDIA H200 (simulated)"
DEFAULT_MEMORY_MIB = 143771
#: A registered create time may differ from psutil's by float rounding only; a reused pid
#: starts much later than the process that registered.
_CREATE_TIME_TOLERANCE_S = 1.0


def sim_gpu_uuid(index: int) -> str:
    """The stable, NVML-shaped UUID of simulated GPU ``index``."""
    return f"GPU-00000000-5151-4000-8000-{index:012x}"


def sim_gpu_index(uuid: str) -> int | None:
    """The index of a simulated GPU UUID, or None when it is not one."""
    prefix = "GPU-00000000-5151-4000-8000-"
    if not uuid.lower().startswith(prefix.lower()):
        return None
    try:
        return int(uuid[len(prefix) :], 16)
    except ValueError:
        return None


@dataclass(frozen=True)
class Registration:
    pid: int
    create_time: float | None
    gpu_uuid: str
    bytes: int
    #: After the process is gone its memory stays held until this unix time.
    held_until: float | None = None

    def still_held(self, now: float) -> bool:
        return self.held_until is not None and now < self.held_until


def read_registry(registry_dir: Path) -> list[Registration]:
    """Every well-formed entry in the registry, live or not.

    An entry being written (only ``.<pid>.json.tmp`` files are ever partial) or replaced
    at the same moment is skipped or read whole; a malformed one is skipped. Raises
    ``GpuQueryError`` when the directory itself cannot be read.
    """
    try:
        names = os.listdir(registry_dir)
    except OSError as exc:
        raise GpuQueryError(
            f"cannot read the simulated GPU registry {registry_dir}: {exc.strerror}"
        ) from exc
    out: list[Registration] = []
    for name in names:
        if name.startswith(".") or not name.endswith(".json"):
            continue
        try:
            data = json.loads((registry_dir / name).read_bytes())
            ctime = data.get("create_time")
            until = data.get("held_until")
            reg = Registration(
                pid=int(data["pid"]),
                create_time=None if ctime is None else float(ctime),
                gpu_uuid=str(data["gpu_uuid"]),
                bytes=int(data["bytes"]),
                held_until=None if until is None else float(until),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # removed meanwhile, or not ours to understand
        out.append(reg)
    return out


def holds_memory(reg: Registration) -> bool:
    """Whether the registering process still exists as itself and is not a zombie."""
    try:
        proc = psutil.Process(reg.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if reg.create_time is not None:
            return abs(proc.create_time() - reg.create_time) <= _CREATE_TIME_TOLERANCE_S
        return True
    except psutil.NoSuchProcess:  # includes ZombieProcess on some platforms
        return False
    except psutil.AccessDenied:
        return True  # it exists; we only cannot look closer


def prepare_registry(registry_dir: Path) -> list[int]:
    """Create the registry directory and remove entries of processes that are gone.

    Returns the pids whose entries were removed. Entries of live processes stay: their
    memory is still held.
    """
    registry_dir.mkdir(parents=True, exist_ok=True)
    removed: list[int] = []
    now = time.time()
    for reg in read_registry(registry_dir):
        if not holds_memory(reg) and not reg.still_held(now):
            (registry_dir / f"{reg.pid}.json").unlink(missing_ok=True)
            removed.append(reg.pid)
    for tmp in registry_dir.glob(".*.json.tmp"):
        pid_text = tmp.name[1 : -len(".json.tmp")]
        if pid_text.isdigit() and not psutil.pid_exists(int(pid_text)):
            tmp.unlink(missing_ok=True)
    return removed


class SimGpuProbe:
    """``GpuProbe`` over ``count`` simulated GPUs whose memory lives in ``registry_dir``."""

    kind = "simulated"

    def __init__(
        self,
        registry_dir: Path,
        count: int = 8,
        memory_total_mib: int = DEFAULT_MEMORY_MIB,
        baseline_mib: int = 0,
    ) -> None:
        if count < 1:
            raise ValueError(f"a simulated host needs at least one GPU, got count={count}")
        self.registry_dir = registry_dir
        self._total_bytes = memory_total_mib * 2**20
        self._baseline_bytes = baseline_mib * 2**20
        self._devices = [
            GpuInfo(i, sim_gpu_uuid(i), SIM_GPU_NAME, self._total_bytes) for i in range(count)
        ]

    def devices(self) -> list[GpuInfo]:
        return list(self._devices)

    def sample(self, indices: Sequence[int]) -> list[GpuSample]:
        """Used memory = baseline + bytes of live registered pids on each GPU.

        Raises ``GpuQueryError`` for an index that does not exist or an unreadable registry.
        """
        for i in indices:
            if not 0 <= i < len(self._devices):
                raise GpuQueryError(
                    f"simulated GPU {i} does not exist (this host has {len(self._devices)}: "
                    f"0-{len(self._devices) - 1})"
                )
        by_uuid: dict[str, list[GpuProcess]] = {}
        unpinning: dict[str, int] = {}  # held by processes gone, no process listed
        now = time.time()
        for reg in read_registry(self.registry_dir):
            uuid = reg.gpu_uuid.lower()
            if holds_memory(reg):
                by_uuid.setdefault(uuid, []).append(GpuProcess(reg.pid, reg.bytes))
            elif reg.still_held(now):
                unpinning[uuid] = unpinning.get(uuid, 0) + reg.bytes
        out: list[GpuSample] = []
        for i in indices:
            dev = self._devices[i]
            procs = tuple(sorted(by_uuid.get(dev.uuid.lower(), []), key=lambda p: p.pid))
            used = self._baseline_bytes + sum(p.used_bytes or 0 for p in procs)
            used += unpinning.get(dev.uuid.lower(), 0)
            out.append(
                GpuSample(
                    index=dev.index,
                    uuid=dev.uuid,
                    name=dev.name,
                    memory_used_bytes=used,
                    memory_total_bytes=dev.memory_total_bytes,
                    processes=procs,
                )
            )
        return out

    def pids_are_local(self) -> bool:
        return True

    def close(self) -> None:
        """Nothing to release: the registry is plain files."""
