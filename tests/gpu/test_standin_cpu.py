"""The SGLang-shaped stand-in of the end-to-end GPU test, on a CPU (fake-GPU mode).

What the GPU test relies on, checked where CI runs: the launcher answers SGLang's endpoints
once every rank holds its memory, places rank r on CUDA device ``base_gpu_id + r ×
gpu_id_step``, exits at once on SIGTERM, and its switches
produce ranks that ``setsid`` and ignore SIGTERM, or die of an out-of-memory error at start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sglang_supervisor.sim.gpus import SimGpuProbe, holds_memory, read_registry, sim_gpu_uuid
from tests.checkpoints import write_checkpoint
from tests.gpu.e2e import STANDIN_ROOT, alive
from tests.helpers import free_port, wait_until

pytestmark = pytest.mark.timeout(120)
MIB = 1000


class Standin:
    def __init__(self, tmp: Path, argv: list[str], **env: str) -> None:
        self.registry = tmp / "gpus"
        self.registry.mkdir()
        self.port = free_port()
        self.log = tmp / "standin.log"
        full_env = {
            **os.environ,
            "PYTHONPATH": str(STANDIN_ROOT),
            "CUDA_VISIBLE_DEVICES": ",".join(sim_gpu_uuid(i) for i in (2, 0, 1)),
            "SGLANG_STANDIN_FAKE_GPU_DIR": str(self.registry),
            "SGLANG_STANDIN_FAKE_GPU_MIB": str(MIB),
            **env,
        }
        cmd = [sys.executable, "-m", "sglang.launch_server", "--port", str(self.port), *argv]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT)
        self.probe = SimGpuProbe(self.registry, count=3, memory_total_mib=MIB)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"http://127.0.0.1:{self.port}{path}", timeout=5, trust_env=False)

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"launcher exited {self.proc.returncode}: {self.log.read_text()}")
        try:
            return self.get("/health_generate").status_code == 200
        except httpx.HTTPError:
            return False

    def info(self) -> dict[str, Any]:
        data: dict[str, Any] = self.get("/get_server_info").json()
        return data

    def kill_all(self) -> None:
        """SIGKILL the launcher and every rank still registered as itself (no reused pid)."""
        pids = {self.proc.pid} | {r.pid for r in read_registry(self.registry) if holds_memory(r)}
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def standins(tmp_path: Path) -> Iterator[list[Standin]]:
    made: list[Standin] = []
    yield made
    for s in made:
        s.kill_all()


def test_ranks_on_their_devices_and_sigterm_exits(standins: list[Standin], tmp_path: Path) -> None:
    s = Standin(tmp_path, ["--tp-size", "2", "--mem-fraction-static", "0.5", "--base-gpu-id", "1"])
    standins.append(s)
    wait_until(s.healthy, 30, 0.05, "/health_generate 200")
    ranks = sorted(s.info()["standin"]["ranks"], key=lambda r: r["rank"])
    # CUDA devices 1 and 2 of CUDA_VISIBLE_DEVICES = simulated GPUs 0 and 1
    assert [(r["cuda_device"], r["uuid"]) for r in ranks] == [
        (1, sim_gpu_uuid(0)),
        (2, sim_gpu_uuid(1)),
    ]
    used = {x.index: x.memory_used_bytes for x in s.probe.sample([0, 1, 2])}
    assert used == {0: MIB * 2**20 // 2, 1: MIB * 2**20 // 2, 2: 0}
    assert "sglang:num_running_reqs" in s.get("/metrics").text
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(5) in (0, 1)  # at once; its ranks get SIGTERM too
    # Orphaned ranks may stay zombies under a subreaper that never reaps (pytest itself once
    # test_gpu_release.py made it one): a zombie holds nothing and counts as gone.
    wait_until(lambda: not alive([r["pid"] for r in ranks]), 10, 0.05, "ranks")


def test_detached_ranks_ignoring_sigterm_outlive_the_launcher(
    standins: list[Standin], tmp_path: Path
) -> None:
    s = Standin(
        tmp_path, ["--tp-size", "2"], SGLANG_STANDIN_SETSID="1", SGLANG_STANDIN_IGNORE_SIGTERM="1"
    )
    standins.append(s)
    wait_until(s.healthy, 30, 0.05, "/health_generate 200")
    ranks = s.info()["standin"]["ranks"]
    assert all(r["sid"] == r["pid"] != os.getsid(s.proc.pid) for r in ranks), ranks
    s.proc.send_signal(signal.SIGTERM)
    s.proc.wait(5)
    assert alive([r["pid"] for r in ranks]) == [r["pid"] for r in ranks]  # orphaned, holding
    assert sum(x.memory_used_bytes for x in s.probe.sample([0, 1, 2])) > 0


def test_oom_at_start_takes_the_launcher_down(standins: list[Standin], tmp_path: Path) -> None:
    s = Standin(tmp_path, ["--tp-size", "1"], SGLANG_STANDIN_OOM="1")
    standins.append(s)
    assert s.proc.wait(30) == 1
    assert "out of memory" in s.log.read_text().lower()


def test_each_rank_loads_its_share_of_the_weights(standins: list[Standin], tmp_path: Path) -> None:
    """The model directory's shards are read by the ranks (onto the GPU on a GPU host),
    before the server answers: rank r takes shards r, r + n, ..."""
    ckpt = write_checkpoint(tmp_path / "model")
    s = Standin(tmp_path, ["--tp-size", "2", "--model-path", str(ckpt)])
    standins.append(s)
    wait_until(s.healthy, 30, 0.05, "/health_generate 200")
    ranks = sorted(s.info()["standin"]["ranks"], key=lambda r: r["rank"])
    shards = sorted(ckpt.glob("*.safetensors"))
    assert [(r["weights_files"], r["weights_bytes"]) for r in ranks] == [
        (1, shards[0].stat().st_size),
        (1, shards[1].stat().st_size),
    ]
    assert {r["weights_loader"] for r in ranks} == {"read (fake GPU)"}
