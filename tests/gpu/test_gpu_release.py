"""Real-GPU proof: the supervisor's own teardown frees the GPU, and NVML says so.

The stand-in (``standin.py``) is spawned with ``sglang_supervisor.host.process.spawn``, stopped with
``sglang_supervisor.host.teardown.teardown`` and verified with
``sglang_supervisor.host.gpu.wait_released`` over an ``NvmlProbe``. A background thread samples NVML
every few milliseconds, so each case reports its phases: SIGTERM -> SIGKILL (grace), SIGTERM ->
every member gone (exit), SIGTERM -> NVML shows the memory free, and the release verdict.

    pytest -m gpu tests/gpu -s             # GPU index 0, or SUPERVISOR_TEST_GPU=<index|uuid>
    GPU_RELEASE_RESULTS=out.jsonl pytest -m gpu tests/gpu -s   # also write one JSON a case
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor.host.gpu import (
    GpuInfo,
    GpuQueryError,
    cuda_visible_devices,
    resolve_gpus,
    wait_released,
)
from sglang_supervisor.host.nvml import NvmlProbe
from tests.helpers import TEST_INSTANCE_PREFIX, register_tag

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

GIB = 2**30
STANDIN = Path(__file__).with_name("standin.py")
TOLERANCE_BYTES = 256 * 2**20
GRACE_S = 2.0


def _torch_cuda_ok() -> bool:
    # In a child: the test process itself must hold no CUDA context (it would count
    # against the baseline and make fork unsafe).
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def probe() -> Iterator[NvmlProbe]:
    p = NvmlProbe()
    try:
        devices = p.devices()
    except GpuQueryError as exc:
        pytest.skip(f"no NVML: {exc}")
    if not devices:
        pytest.skip("NVML sees no GPU")
    if not _torch_cuda_ok():
        pytest.skip("torch with CUDA is not available to run the stand-in")
    yield p
    p.close()


@pytest.fixture(scope="module")
def gpu(probe: NvmlProbe) -> GpuInfo:
    from sglang_supervisor.host import process

    process.set_child_subreaper()  # as the daemon does: orphaned ranks come back to us
    return resolve_gpus(probe, [os.environ.get("SUPERVISOR_TEST_GPU", "0")])[0]


@dataclass
class Case:
    name: str
    ranks: int
    gib: float
    ignore_sigterm: tuple[int, ...] = ()
    pin_gib: float = 0.0
    #: SIGKILL the launcher alone first: its ranks are orphaned (a crashed launcher).
    orphan: bool = False


CASES = [
    Case("2x4GiB-sigterm", ranks=2, gib=4),
    Case("4x4GiB-one-ignores-sigterm", ranks=4, gib=4, ignore_sigterm=(1,)),
    Case("2x16GiB-one-ignores-sigterm", ranks=2, gib=16, ignore_sigterm=(0,)),
    Case("4x8GiB-orphaned-by-launcher-kill", ranks=4, gib=8, orphan=True),
    Case("2x4GiB-pin8GiB-sigterm", ranks=2, gib=4, pin_gib=8),
    Case("2x4GiB-pin8GiB-pinned-rank-ignores", ranks=2, gib=4, pin_gib=8, ignore_sigterm=(0,)),
]


def truly_gone(pid: int) -> bool:
    """The process has finished exiting: no /proc entry, or a zombie with no thread left.

    A multithreaded process's leader turns zombie as soon as *its* thread exits, while its
    other threads are still tearing down the address space and the GPU context; only when
    ``/proc/<pid>/task`` is down to the leader is the process really dead (reapable).
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state in ("Z", "X") and len(os.listdir(f"/proc/{pid}/task")) <= 1
    except (FileNotFoundError, ProcessLookupError):
        return True


class Monitor:
    """Samples, every ``interval_s`` in a thread, one GPU through NVML (t, used, pids) and
    when each of ``pids`` has truly exited (``truly_gone``)."""

    def __init__(
        self, probe: NvmlProbe, index: int, pids: list[int], interval_s: float = 0.005
    ) -> None:
        self.probe, self.index, self.interval_s = probe, index, interval_s
        self.pids = pids
        self.samples: list[tuple[float, int, tuple[int, ...]]] = []
        self.gone_at: dict[int, float] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            for pid in self.pids:
                if pid not in self.gone_at and truly_gone(pid):
                    self.gone_at[pid] = now
            try:
                s = self.probe.sample([self.index])[0]
            except GpuQueryError as exc:
                self.errors.append(str(exc))
            else:
                pids = tuple(p.pid for p in s.processes)
                self.samples.append((time.monotonic(), s.memory_used_bytes, pids))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def first_at_or_below(self, limit: int, after: float) -> float | None:
        for t, used, _ in self.samples:
            if t >= after and used <= limit:
                return t
        return None

    def all_gone_at(self) -> float | None:
        if set(self.gone_at) != set(self.pids):
            return None
        return max(self.gone_at.values(), default=None)


def _wait_ready(log_path: Path, ranks: int, launch: Any, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        if text.count("READY rank=") >= ranks:
            return
        if launch.poll():
            pytest.fail(f"stand-in {launch.describe_exit()} before ready:\n{text[-4000:]}")
        time.sleep(0.05)
    pytest.fail(f"stand-in not ready in {timeout_s}s:\n{log_path.read_text()[-4000:]}")


def _record(result: dict[str, Any]) -> None:
    print("\nGPU-RELEASE " + json.dumps(result, sort_keys=True))
    out = os.environ.get("GPU_RELEASE_RESULTS")
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(result, sort_keys=True) + "\n")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_teardown_releases_gpu(case: Case, probe: NvmlProbe, gpu: GpuInfo, tmp_path: Path) -> None:
    from sglang_supervisor.host import process, teardown

    baseline = probe.sample([gpu.index])[0].memory_used_bytes
    tag = register_tag(
        f"{TEST_INSTANCE_PREFIX}-gpu-{uuid.uuid4().hex[:8]}"
    )  # the suite guard sees it
    _, cuda_env = cuda_visible_devices([gpu])
    env = {**os.environ, **cuda_env, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, str(STANDIN), "--ranks", str(case.ranks), "--gib", str(case.gib)]
    argv += ["--pin-gib", str(case.pin_gib)]
    if case.ignore_sigterm:
        argv += ["--ignore-sigterm", *map(str, case.ignore_sigterm)]
    log_path = tmp_path / "standin.log"

    t_spawn = time.monotonic()
    launch = process.spawn(argv, env, tag=tag, log_path=log_path)
    try:
        _wait_ready(log_path, case.ranks, launch)
        ready_s = time.monotonic() - t_spawn
        held = probe.sample([gpu.index])[0]
        members = process.find_members(launch, tag=tag)
        held_extra = held.memory_used_bytes - baseline
        # NVML sees the allocations.
        assert held_extra >= case.ranks * case.gib * GIB, held
        nvml_pids = {p.pid for p in held.processes}

        if case.orphan:
            os.kill(launch.pid, signal.SIGKILL)
            while not launch.poll():
                time.sleep(0.01)
            assert probe.sample([gpu.index])[0].memory_used_bytes >= baseline + held_extra // 2

        started: list[float] = []

        def clock() -> float:
            now = time.monotonic()
            if not started:
                started.append(now)  # teardown's first clock read: just before SIGTERM
            return now

        alive = sorted(process.find_members(launch, tag=tag))
        with Monitor(probe, gpu.index, alive) as mon:
            report = teardown.teardown(
                launch, tag=tag, grace_s=GRACE_S, kill_timeout_s=30.0, clock=clock
            )
            t_down = time.monotonic()
            verdict = wait_released(
                probe,
                [gpu.index],
                {gpu.index: baseline},
                lambda: report.members,
                timeout_s=60.0,
                tolerance_bytes=TOLERANCE_BYTES,
                consecutive=3,
                interval_s=0.02,
            )
        t0 = started[0]
        free_at = mon.first_at_or_below(baseline + TOLERANCE_BYTES, after=t0)
        gone_at = mon.all_gone_at()
    finally:
        if process.find_members(launch, tag=tag):  # a failed assertion must not leave
            teardown.teardown(launch, tag=tag, grace_s=0.5, kill_timeout_s=10.0)  # GPU memory

    left = process.find_members(None, tag=tag)
    result = {
        "case": case.name,
        "gpu": gpu.name,
        "ranks": case.ranks,
        "gpu_gib_per_rank": case.gib,
        "pinned_gib": case.pin_gib,
        "ignore_sigterm": list(case.ignore_sigterm),
        "orphaned_first": case.orphan,
        "pids_are_local": probe.pids_are_local(),
        "nvml_listed_member_pids": len(nvml_pids & set(members)),
        "nvml_process_used_mib": sorted(
            -1 if p.used_bytes is None else round(p.used_bytes / 2**20) for p in held.processes
        ),
        "baseline_mib": round(baseline / 2**20),
        "held_above_baseline_mib": round(held_extra / 2**20),
        "ready_s": round(ready_s, 3),
        "members": len(report.members),
        "sigkill_sent": len(report.sigkill_sent),
        "sigterm_to_sigkill_s": _r(report.kill_after_s),
        # process.teardown's own figure: its members count as gone once the leader thread
        # is a zombie, which can be long before the process has finished exiting.
        "sigterm_to_exit_s": _r(report.exit_s),
        "sigkill_to_exit_s": _r(
            None
            if report.kill_after_s is None or report.exit_s is None
            else report.exit_s - report.kill_after_s
        ),
        "sigterm_to_true_exit_s": _r(None if gone_at is None else gone_at - t0),
        "true_exit_to_nvml_free_s": _r(
            None if free_at is None or gone_at is None else free_at - gone_at
        ),
        "sigterm_to_nvml_free_s": _r(None if free_at is None else free_at - t0),
        "exit_to_nvml_free_s": _r(
            None if free_at is None or report.exit_s is None else free_at - t0 - report.exit_s
        ),
        "sigterm_to_release_verdict_s": _r(t_down - t0 + verdict.elapsed_s),
        "verdict_wait_s": _r(verdict.elapsed_s),
        "verdict_samples": verdict.samples,
        "monitor_samples": len(mon.samples),
        "monitor_errors": len(mon.errors),
        "survivors": [s.describe() for s in report.survivors],
        "members_left": sorted(left),
    }
    _record(result)

    if probe.pids_are_local():  # same PID namespace: NVML names exactly our ranks
        assert len(nvml_pids & set(members)) == case.ranks, (nvml_pids, members)
    assert report.clean, report.describe()
    assert gone_at is not None, f"members still exiting: {set(alive) - set(mon.gone_at)}"
    assert not left, f"member processes remain: {left}"
    assert verdict.released, verdict.describe()
    assert not mon.errors, mon.errors[:3]
    after = probe.sample([gpu.index])[0]
    assert after.memory_used_bytes <= baseline + TOLERANCE_BYTES, after
    assert not (set(report.members) & {p.pid for p in after.processes})
    if case.ignore_sigterm:
        assert report.sigkill_sent, "a rank ignoring SIGTERM must have needed SIGKILL"
    else:
        assert not report.sigkill_sent, report.describe()


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def test_nvml_query_latency(probe: NvmlProbe, gpu: GpuInfo) -> None:
    """How long one ``sample()`` of one GPU takes (memory + process list): microseconds."""
    for _ in range(50):
        probe.sample([gpu.index])
    times = []
    for _ in range(2000):
        t = time.perf_counter()
        probe.sample([gpu.index])
        times.append(time.perf_counter() - t)
    times.sort()
    result: dict[str, Any] = {
        "case": "nvml-sample-latency",
        "gpu": gpu.name,
        "calls": len(times),
        "median_us": round(statistics.median(times) * 1e6, 1),
        "p99_us": round(times[int(len(times) * 0.99)] * 1e6, 1),
        "pids_are_local": probe.pids_are_local(),
        "pid_ns": os.readlink("/proc/self/ns/pid"),
    }
    _record(result)
    assert result["median_us"] < 10_000


def test_devices_match_cuda_by_uuid(probe: NvmlProbe, gpu: GpuInfo) -> None:
    """The UUID we pass as CUDA_VISIBLE_DEVICES is the GPU torch then opens."""
    value, env = cuda_visible_devices([gpu])
    code = "import torch; p = torch.cuda.get_device_properties(0); print(p.uuid, p.name)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    torch_uuid = out[0].lower().removeprefix("gpu-")
    assert value.lower() == f"gpu-{torch_uuid}", (out, value)
