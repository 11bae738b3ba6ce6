"""Simulated GPUs: memory counts only for registered pids that are alive, themselves and
not zombies; a bad index is an error, never "empty"."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from sglang_supervisor.host.gpu import GpuQueryError
from sglang_supervisor.sim import capacity, rank
from sglang_supervisor.sim.faults import Faults, parse_faults
from sglang_supervisor.sim.gpus import SimGpuProbe, prepare_registry, sim_gpu_index, sim_gpu_uuid

MIB = 2**20
NVML_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def write_entry(
    registry: Path, pid: int, gpu: int, nbytes: int, create_time: float | None = None
) -> None:
    entry = {"pid": pid, "create_time": create_time, "gpu_uuid": sim_gpu_uuid(gpu), "bytes": nbytes}
    (registry / f"{pid}.json").write_text(json.dumps(entry))


@pytest.fixture
def sleeper() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start idle child processes; every one is killed and reaped afterwards."""
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        procs.append(p)
        return p

    try:
        yield start
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def test_counts_only_live_non_zombie_pids(
    tmp_path: Path, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    live, dead, zombie = sleeper(), sleeper(), sleeper()
    dead.kill()
    dead.wait(timeout=10)
    zombie.kill()  # not reaped yet: a zombie holds no GPU memory
    wait_until(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, 10, "a zombie")
    write_entry(tmp_path, live.pid, gpu=0, nbytes=100 * MIB)
    write_entry(
        tmp_path, os.getpid(), gpu=1, nbytes=7 * MIB, create_time=rank.create_time(os.getpid())
    )
    write_entry(tmp_path, dead.pid, gpu=0, nbytes=1000 * MIB)
    write_entry(tmp_path, zombie.pid, gpu=2, nbytes=1000 * MIB)

    probe = SimGpuProbe(tmp_path, count=4, memory_total_mib=2048, baseline_mib=10)
    s0, s1, s2, s3 = probe.sample([0, 1, 2, 3])

    assert s0.memory_used_bytes == (10 + 100) * MIB
    assert [p.pid for p in s0.processes] == [live.pid]
    assert s0.processes[0].used_bytes == 100 * MIB
    assert s1.memory_used_bytes == (10 + 7) * MIB
    assert s2.memory_used_bytes == 10 * MIB and s2.processes == ()
    assert s3.memory_used_bytes == 10 * MIB
    assert all(s.memory_total_bytes == 2048 * MIB for s in (s0, s1, s2, s3))


def test_reused_pid_does_not_count(tmp_path: Path) -> None:
    # Our own pid, but registered by a process that started an hour before us.
    me = psutil.Process().create_time()
    write_entry(tmp_path, os.getpid(), gpu=0, nbytes=5 * MIB, create_time=me - 3600)
    (sample,) = SimGpuProbe(tmp_path).sample([0])
    assert sample.memory_used_bytes == 0


def test_rank_create_time_matches_psutil() -> None:
    ours = rank.create_time(os.getpid())
    assert ours is not None
    assert abs(ours - psutil.Process().create_time()) < 0.05


def test_partial_and_foreign_files_are_skipped(
    tmp_path: Path, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    live = sleeper()
    write_entry(tmp_path, live.pid, gpu=0, nbytes=3 * MIB)
    (tmp_path / "123.json").write_text('{"pid": 123, "gpu_uu')  # torn write
    (tmp_path / "124.json").write_text("[]")
    (tmp_path / f".{live.pid}.json.tmp").write_text('{"pid": ')
    (tmp_path / "notes.txt").write_text("hello")
    (sample,) = SimGpuProbe(tmp_path).sample([0])
    assert sample.memory_used_bytes == 3 * MIB


def test_register_is_atomic_and_counted(tmp_path: Path) -> None:
    path = rank.register(tmp_path, sim_gpu_uuid(5), 42 * MIB)
    assert path.name == f"{os.getpid()}.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no tmp file left
    sample = SimGpuProbe(tmp_path).sample([5])[0]
    assert sample.memory_used_bytes == 42 * MIB
    assert [p.pid for p in sample.processes] == [os.getpid()]


def test_unknown_index_is_an_error(tmp_path: Path) -> None:
    probe = SimGpuProbe(tmp_path, count=2)
    with pytest.raises(GpuQueryError, match="GPU 2 does not exist"):
        probe.sample([0, 2])
    with pytest.raises(GpuQueryError):
        probe.sample([-1])


def test_missing_registry_is_an_error_not_zero(tmp_path: Path) -> None:
    with pytest.raises(GpuQueryError, match="registry"):
        SimGpuProbe(tmp_path / "nope").sample([0])


def test_uuids_are_stable_and_nvml_shaped(tmp_path: Path) -> None:
    devices = SimGpuProbe(tmp_path, count=8, memory_total_mib=143771).devices()
    assert [d.index for d in devices] == list(range(8))
    assert [d.uuid for d in devices] == [sim_gpu_uuid(i) for i in range(8)]
    assert len({d.uuid for d in devices}) == 8
    assert all(NVML_UUID.match(d.uuid) for d in devices)
    assert all(d.name == "NVIDIA H200 (simulated)" for d in devices)
    assert devices[0].memory_total_bytes == 143771 * MIB
    assert sim_gpu_uuid(3) == "GPU-00000000-5151-4000-8000-000000000003"
    assert sim_gpu_index(sim_gpu_uuid(11)) == 11
    assert sim_gpu_index("GPU-12345678-aaaa-bbbb-cccc-000000000001") is None
    probe = SimGpuProbe(tmp_path)
    assert probe.kind == "simulated" and probe.pids_are_local()


def test_prepare_registry_removes_only_dead_entries(
    tmp_path: Path, sleeper: Callable[[], subprocess.Popen[bytes]]
) -> None:
    registry = tmp_path / "reg"
    assert prepare_registry(registry) == []
    live, dead = sleeper(), sleeper()
    dead.kill()
    dead.wait(timeout=10)
    write_entry(registry, live.pid, gpu=0, nbytes=MIB)
    write_entry(registry, dead.pid, gpu=0, nbytes=MIB)
    assert prepare_registry(registry) == [dead.pid]
    assert sorted(p.name for p in registry.iterdir()) == [f"{live.pid}.json"]


def test_fp8_kv_doubles_tokens_and_tp_splits_weights() -> None:
    m = capacity.SIM_MODEL
    total = 143771 * MIB
    bf16 = capacity.kv_tokens(
        total, 0.85, capacity.weight_bytes_per_rank(m, 8), capacity.cell_bytes(m, 8, "auto")
    )
    fp8 = capacity.kv_tokens(
        total, 0.85, capacity.weight_bytes_per_rank(m, 8), capacity.cell_bytes(m, 8, "fp8_e4m3")
    )
    assert capacity.cell_bytes(m, 8, "auto") == 2 * 80 * 1 * 128 * 2
    assert capacity.cell_bytes(m, 16, "auto") == capacity.cell_bytes(m, 8, "auto")  # max(1, ..)
    assert fp8 == pytest.approx(2 * bf16, abs=1)
    # The weights alone do not fit one GPU: no KV room, never negative.
    one = capacity.kv_tokens(
        total, 0.85, capacity.weight_bytes_per_rank(m, 1), capacity.cell_bytes(m, 1, None)
    )
    assert one == 0


def test_parse_faults() -> None:
    assert parse_faults("") == Faults()
    f = parse_faults(" crash_after=0.5, ignore_sigterm,detach_ranks ,unhealthy_after=2")
    assert f == Faults(ignore_sigterm=True, detach_ranks=True, crash_after=0.5, unhealthy_after=2.0)
    with pytest.raises(ValueError, match="unknown fault 'crash_on_strat'"):
        parse_faults("crash_on_strat")
    with pytest.raises(ValueError, match="crash_after=soon"):
        parse_faults("crash_after=soon")
