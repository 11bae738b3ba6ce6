"""NvmlProbe against a fake ``pynvml`` module: mapping, errors, lazy init, PID namespaces."""

from __future__ import annotations

import os
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor.host.gpu import (
    GpuQueryError,
    cuda_visible_devices,
    resolve_gpus,
    wait_released,
)
from sglang_supervisor.host.nvml import (
    ROOT_PID_NS_INODE,
    NvmlFeatureMissing,
    NvmlProbe,
    pid_namespace_is_root,
)

GIB = 2**30

# NVML orders GPUs by PCI bus; CUDA's default order is "fastest first". These differ.
NVML_GPUS = [
    # (uuid, name, total, pci bus)
    ("GPU-aaaa0000-0000-0000-0000-000000000000", "NVIDIA A10", 24 * GIB),
    ("GPU-bbbb1111-1111-1111-1111-111111111111", "NVIDIA H200", 141 * GIB),
    ("GPU-cccc2222-2222-2222-2222-222222222222", "NVIDIA L4", 24 * GIB),
    ("GPU-dddd3333-3333-3333-3333-333333333333", "NVIDIA H200", 141 * GIB),
]
#: CUDA's FASTEST_FIRST enumeration of the same cards: NVML index for each CUDA ordinal.
CUDA_FASTEST_FIRST = [1, 3, 0, 2]


class Proc:
    def __init__(self, pid: int, used: int | None) -> None:
        self.pid = pid
        self.usedGpuMemory = used


class Mem:
    def __init__(self, total: int, used: int) -> None:
        self.total, self.used, self.free = total, used, total - used


def make_pynvml(*, v2: bool = True, init_delay_s: float = 0.0) -> types.ModuleType:
    """A module shaped like nvidia-ml-py's ``pynvml``, backed by editable state."""
    m = types.ModuleType("pynvml")
    codes = {
        "NVML_ERROR_INVALID_ARGUMENT": 2,
        "NVML_ERROR_NOT_SUPPORTED": 3,
        "NVML_ERROR_NO_PERMISSION": 4,
        "NVML_ERROR_NOT_FOUND": 6,
        "NVML_ERROR_DRIVER_NOT_LOADED": 9,
        "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
        "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
        "NVML_ERROR_GPU_IS_LOST": 15,
        "NVML_ERROR_UNKNOWN": 999,
    }
    for k, v in codes.items():
        setattr(m, k, v)

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            self.value = value

        def __str__(self) -> str:
            return {v: k for k, v in codes.items()}.get(self.value, "Unknown Error")

    class NVMLLibraryMismatchError(Exception):
        pass

    m.__dict__.update(
        NVMLError=NVMLError,
        NVMLLibraryMismatchError=NVMLLibraryMismatchError,
        nvmlMemory_v2=0x02000028,
    )
    state: dict[str, Any] = {
        "init_calls": 0,
        "shutdown_calls": 0,
        "init_error": None,
        "fail": {},  # function name -> error code
        "used": {i: 1 * GIB for i in range(len(NVML_GPUS))},
        "procs": {i: [] for i in range(len(NVML_GPUS))},
        "mem_versions": [],
    }
    m.__dict__["state"] = state

    def check(name: str) -> None:
        code = state["fail"].get(name)
        if code is not None:
            raise NVMLError(code)

    def nvmlInit() -> None:
        time.sleep(init_delay_s)
        state["init_calls"] += 1
        if state["init_error"] is not None:
            raise NVMLError(state["init_error"])

    def nvmlShutdown() -> None:
        state["shutdown_calls"] += 1

    def nvmlDeviceGetCount() -> int:
        check("nvmlDeviceGetCount")
        return len(NVML_GPUS)

    def nvmlDeviceGetHandleByIndex(i: int) -> int:
        check("nvmlDeviceGetHandleByIndex")
        if not 0 <= i < len(NVML_GPUS):
            raise NVMLError(codes["NVML_ERROR_INVALID_ARGUMENT"])
        return 100 + i

    def nvmlDeviceGetUUID(h: int) -> str:
        check("nvmlDeviceGetUUID")
        return NVML_GPUS[h - 100][0]

    def nvmlDeviceGetName(h: int) -> bytes:
        check("nvmlDeviceGetName")
        return NVML_GPUS[h - 100][1].encode()  # old pynvml returns bytes

    def nvmlDeviceGetMemoryInfo(h: int, version: int | None = None) -> Mem:
        check("nvmlDeviceGetMemoryInfo")
        if version is not None and not v2:
            raise NVMLError(codes["NVML_ERROR_FUNCTION_NOT_FOUND"])
        state["mem_versions"].append(version)
        i = h - 100
        return Mem(NVML_GPUS[i][2], state["used"][i])

    def nvmlDeviceGetComputeRunningProcesses(h: int) -> list[Proc]:
        check("nvmlDeviceGetComputeRunningProcesses")
        return list(state["procs"][h - 100])

    for fn in (
        nvmlInit,
        nvmlShutdown,
        nvmlDeviceGetCount,
        nvmlDeviceGetHandleByIndex,
        nvmlDeviceGetUUID,
        nvmlDeviceGetName,
        nvmlDeviceGetMemoryInfo,
        nvmlDeviceGetComputeRunningProcesses,
    ):
        setattr(m, fn.__name__, fn)
    return m


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    m = make_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", m)
    return m


def test_import_has_no_side_effects(monkeypatch: pytest.MonkeyPatch) -> None:
    m = make_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", m)
    probe = NvmlProbe()
    assert probe.kind == "nvml"
    assert m.state["init_calls"] == 0


def test_devices_in_nvml_order(fake: types.ModuleType) -> None:
    devices = NvmlProbe().devices()
    assert [d.index for d in devices] == [0, 1, 2, 3]
    assert [d.uuid for d in devices] == [g[0] for g in NVML_GPUS]
    assert devices[1].name == "NVIDIA H200"  # bytes decoded
    assert devices[1].memory_total_bytes == 141 * GIB


def cuda_selects(env: dict[str, str]) -> list[str]:
    """Which physical GPUs (by UUID) CUDA opens for ``CUDA_VISIBLE_DEVICES`` (a model)."""
    order = (
        list(range(len(NVML_GPUS)))
        if env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
        else CUDA_FASTEST_FIRST
    )
    out = []
    for item in env["CUDA_VISIBLE_DEVICES"].split(","):
        if item.startswith("GPU-"):
            out.append(next(g[0] for g in NVML_GPUS if g[0] == item))
        else:
            out.append(NVML_GPUS[order[int(item)]][0])
    return out


def test_configured_indices_reach_the_same_gpus_under_cuda(fake: types.ModuleType) -> None:
    probe = NvmlProbe()
    gpus = resolve_gpus(probe, ["2", NVML_GPUS[0][0].upper()])
    assert [g.index for g in gpus] == [2, 0]
    value, env = cuda_visible_devices(gpus)
    assert value == f"{NVML_GPUS[2][0]},{NVML_GPUS[0][0]}"
    assert env == {"CUDA_VISIBLE_DEVICES": value, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert cuda_selects(env) == [NVML_GPUS[2][0], NVML_GPUS[0][0]]
    # What the UUIDs protect against: NVML indices read in CUDA's default order.
    wrong = cuda_selects({"CUDA_VISIBLE_DEVICES": "2,0"})
    assert wrong != cuda_selects(env)


def test_cuda_visible_devices_refuses_no_gpus() -> None:
    with pytest.raises(ValueError, match=r"server\.gpus"):
        cuda_visible_devices([])


def test_unknown_gpu_name_is_rejected_with_what_exists(fake: types.ModuleType) -> None:
    with pytest.raises(ValueError, match=r"GPU-nope.*0=GPU-aaaa"):
        resolve_gpus(NvmlProbe(), ["GPU-nope"])


def test_sample_reports_memory_and_processes(fake: types.ModuleType) -> None:
    fake.state["used"][3] = 90 * GIB
    fake.state["procs"][3] = [Proc(4242, 89 * GIB), Proc(4243, None)]
    [s] = NvmlProbe().sample([3])
    assert (s.index, s.uuid, s.memory_used_bytes) == (3, NVML_GPUS[3][0], 90 * GIB)
    assert [(p.pid, p.used_bytes) for p in s.processes] == [(4242, 89 * GIB), (4243, None)]


def test_not_available_process_memory_is_none(fake: types.ModuleType) -> None:
    fake.state["procs"][0] = [Proc(7, 2**64 - 1)]
    [s] = NvmlProbe().sample([0])
    assert s.processes[0].used_bytes is None


def test_memory_v2_is_preferred(fake: types.ModuleType) -> None:
    NvmlProbe().sample([0, 1])
    assert set(fake.state["mem_versions"]) == {fake.nvmlMemory_v2}


def test_memory_falls_back_to_v1_once(monkeypatch: pytest.MonkeyPatch) -> None:
    m = make_pynvml(v2=False)
    monkeypatch.setitem(sys.modules, "pynvml", m)
    probe = NvmlProbe()
    [s] = probe.sample([1])
    probe.sample([1])
    assert s.memory_used_bytes == 1 * GIB
    assert m.state["mem_versions"] == [None, None]


def test_failed_memory_query_raises_never_zero(fake: types.ModuleType) -> None:
    probe = NvmlProbe()
    probe.sample([1])
    fake.state["fail"]["nvmlDeviceGetMemoryInfo"] = fake.NVML_ERROR_UNKNOWN
    with pytest.raises(GpuQueryError, match="on GPU 1"):
        probe.sample([1])


def test_failed_process_query_raises(fake: types.ModuleType) -> None:
    fake.state["fail"]["nvmlDeviceGetComputeRunningProcesses"] = fake.NVML_ERROR_UNKNOWN
    with pytest.raises(GpuQueryError, match="GPU 2"):
        NvmlProbe().sample([2])


def test_release_is_not_declared_while_queries_fail(fake: types.ModuleType) -> None:
    fake.state["fail"]["nvmlDeviceGetMemoryInfo"] = fake.NVML_ERROR_UNKNOWN
    c = FakeClock()
    result = wait_released(
        NvmlProbe(),
        [0],
        {0: 0},
        lambda: [],
        timeout_s=1.0,
        tolerance_bytes=2 * GIB,
        clock=c.clock,
        sleep=c.sleep,
    )
    assert not result.released
    assert result.error is not None and "GPU 0" in result.error


def test_gpu_lost_names_the_gpu_and_the_remedy(fake: types.ModuleType) -> None:
    fake.state["fail"]["nvmlDeviceGetMemoryInfo"] = fake.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(GpuQueryError, match=r"on GPU 3.*dmesg.*reset") as info:
        NvmlProbe().sample([3])
    assert not isinstance(info.value, NvmlFeatureMissing)


def test_missing_gpu_index_says_fix_config(fake: types.ModuleType) -> None:
    with pytest.raises(GpuQueryError, match=r"GPU 9.*server\.gpus"):
        NvmlProbe().sample([9])


@pytest.mark.parametrize(
    ("const", "expected"),
    [
        ("NVML_ERROR_LIBRARY_NOT_FOUND", r"libnvidia-ml\.so\.1.*NVIDIA driver.*--simulate"),
        ("NVML_ERROR_DRIVER_NOT_LOADED", r"kernel driver is not loaded.*modprobe nvidia"),
        ("NVML_ERROR_NO_PERMISSION", r"/dev/nvidiactl.*video"),
    ],
)
def test_init_failures_are_actionable(
    monkeypatch: pytest.MonkeyPatch, const: str, expected: str
) -> None:
    m = make_pynvml()
    m.state["init_error"] = getattr(m, const)
    monkeypatch.setitem(sys.modules, "pynvml", m)
    with pytest.raises(GpuQueryError, match=expected):
        NvmlProbe().devices()


def test_init_is_retried_after_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    m = make_pynvml()
    m.state["init_error"] = m.NVML_ERROR_DRIVER_NOT_LOADED
    monkeypatch.setitem(sys.modules, "pynvml", m)
    probe = NvmlProbe()
    with pytest.raises(GpuQueryError):
        probe.devices()
    m.state["init_error"] = None
    assert len(probe.devices()) == 4


def test_missing_pynvml_says_which_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes the import fail
    with pytest.raises(GpuQueryError, match=r"nvidia-ml-py.*--simulate"):
        NvmlProbe().devices()


def test_lazy_init_happens_once_under_concurrency(monkeypatch: pytest.MonkeyPatch) -> None:
    m = make_pynvml(init_delay_s=0.05)
    monkeypatch.setitem(sys.modules, "pynvml", m)
    probe = NvmlProbe()
    barrier = threading.Barrier(16)
    errors: list[BaseException] = []

    def worker() -> None:
        barrier.wait()
        try:
            probe.sample([0, 1, 2, 3])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not errors
    assert m.state["init_calls"] == 1


def test_close_shuts_down_once_and_reinitialises_lazily(fake: types.ModuleType) -> None:
    probe = NvmlProbe()
    probe.close()
    assert fake.state["shutdown_calls"] == 0
    probe.devices()
    probe.close()
    probe.close()
    assert fake.state["shutdown_calls"] == 1
    probe.devices()
    assert fake.state["init_calls"] == 2


# -- PID namespaces --------------------------------------------------------------------


def fake_proc(tmp: Path, ns_link: str | None, nspid: str | None) -> Path:
    (tmp / "self" / "ns").mkdir(parents=True)
    if ns_link is not None:
        os.symlink(ns_link, tmp / "self" / "ns" / "pid")  # dangling, as in /proc
    lines = ["Name:\tpython", "Pid:\t42"]
    if nspid is not None:
        lines.append(f"NSpid:\t{nspid}")
    (tmp / "self" / "status").write_text("\n".join(lines) + "\n")
    return tmp


ROOT_LINK = f"pid:[{ROOT_PID_NS_INODE}]"


@pytest.mark.parametrize(
    ("ns_link", "nspid", "expected"),
    [
        (ROOT_LINK, "42", True),  # host, VM, or --pid=host container
        ("pid:[4026532999]", "42", False),  # own namespace; its procfs shows one pid
        ("pid:[4026532999]", "813\t42", False),
        (None, "813\t42", False),  # link unreadable: NSpid proves nesting
        (None, "42", None),  # nothing decides
        (None, None, None),
    ],
)
def test_pid_namespace_detection(
    tmp_path: Path, ns_link: str | None, nspid: str | None, expected: bool | None
) -> None:
    assert pid_namespace_is_root(fake_proc(tmp_path, ns_link, nspid)) is expected


@pytest.mark.parametrize(
    ("ns_link", "nspid", "local"),
    [(ROOT_LINK, "42", True), ("pid:[4026532999]", "42", False), (None, "42", False)],
)
def test_pids_are_local_only_when_provable(
    fake: types.ModuleType, tmp_path: Path, ns_link: str | None, nspid: str, local: bool
) -> None:
    probe = NvmlProbe(proc_root=fake_proc(tmp_path, ns_link, nspid))
    assert probe.pids_are_local() is local


def test_pids_local_override(fake: types.ModuleType, tmp_path: Path) -> None:
    probe = NvmlProbe(pids_local=True, proc_root=fake_proc(tmp_path, None, None))
    assert probe.pids_are_local() is True


def test_container_membership_falls_back_to_memory(fake: types.ModuleType, tmp_path: Path) -> None:
    """In a container NVML lists host pids: release is decided by memory alone."""
    probe = NvmlProbe(proc_root=fake_proc(tmp_path, "pid:[4026532999]", "42"))
    fake.state["procs"][0] = [Proc(913_000, 60 * GIB)]
    fake.state["used"][0] = 61 * GIB
    c = FakeClock()
    held = wait_released(
        probe,
        [0],
        {0: GIB},
        lambda: [42],
        timeout_s=0.5,
        tolerance_bytes=GIB,
        clock=c.clock,
        sleep=c.sleep,
    )
    assert not held.released and held.gpus[0].member_pids == []
    fake.state["procs"][0] = []
    fake.state["used"][0] = GIB
    c = FakeClock()
    freed = wait_released(
        probe,
        [0],
        {0: GIB},
        lambda: [42],
        timeout_s=0.5,
        tolerance_bytes=GIB,
        clock=c.clock,
        sleep=c.sleep,
    )
    assert freed.released


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s
