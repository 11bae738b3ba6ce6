"""A fake ``pynvml`` for rehearsing the real-mode end-to-end test on a host without a GPU.

Put this directory first on the daemon's ``PYTHONPATH`` (``SGS_E2E_FAKE_NVML=1`` does it):
the daemon's ``NvmlProbe`` then sees ``FAKE_NVML_GPUS`` GPUs of ``FAKE_NVML_MEMORY_MIB``
MiB whose used memory is ``FAKE_NVML_BASELINE_MIB`` plus the bytes registered in
``FAKE_NVML_REGISTRY`` by processes that are still alive — the registry the simulated
backend uses (``sglang_supervisor.sim.gpus``), written by the stand-in's ranks in fake-GPU mode.
Only the calls ``sglang_supervisor.host.nvml`` makes exist. Never used against real GPUs.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sglang_supervisor.sim.gpus import holds_memory, read_registry, sim_gpu_uuid

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_UNKNOWN = 999
nvmlMemory_v2 = 0x02000028


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"fake NVML error {value}")
        self.value = value


def _count() -> int:
    return int(os.environ.get("FAKE_NVML_GPUS", "1"))


def _total() -> int:
    return int(os.environ.get("FAKE_NVML_MEMORY_MIB", "143771")) * 2**20


def nvmlInit() -> None:
    if not os.environ.get("FAKE_NVML_REGISTRY"):
        raise NVMLError(NVML_ERROR_UNKNOWN)


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return _count()


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if not 0 <= index < _count():
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return index


def nvmlDeviceGetUUID(handle: int) -> str:
    return sim_gpu_uuid(handle)


def nvmlDeviceGetName(handle: int) -> str:
    return "NVIDIA H200 (fake NVML)"


def nvmlDeviceGetCudaComputeCapability(handle: int) -> tuple[int, int]:
    return (9, 0)


def nvmlSystemGetDriverVersion() -> str:
    return "580.95.05"


def _procs(handle: int) -> list[Any]:
    registry = Path(os.environ["FAKE_NVML_REGISTRY"])
    uuid = sim_gpu_uuid(handle).lower()
    return [
        SimpleNamespace(pid=r.pid, usedGpuMemory=r.bytes)
        for r in read_registry(registry)
        if r.gpu_uuid.lower() == uuid and holds_memory(r)
    ]


def nvmlDeviceGetMemoryInfo(handle: int, version: int | None = None) -> Any:
    baseline = int(os.environ.get("FAKE_NVML_BASELINE_MIB", "512")) * 2**20
    used = baseline + sum(p.usedGpuMemory for p in _procs(handle))
    return SimpleNamespace(total=_total(), used=used, free=max(0, _total() - used))


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[Any]:
    return _procs(handle)
