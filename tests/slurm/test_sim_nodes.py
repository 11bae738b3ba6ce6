"""The simulated server on two Slurm nodes, run bare as one step (no daemon): start-up
couples the nodes, and one node's busy GPU fails the whole group with SGLang's
"The memory capacity is unbalanced" (sglang/srt/distributed/bootstrap.py:441-449); and
node 0's generation waits on every node as a collective does (SGLang's scheduler
broadcasts its input to every TP rank on each pass, srt/managers/scheduler_components/
request_receiver.py:80-101, SGLang 0.5.23): a frozen node 1 stalls ``/health_generate``,
which answers 503 after SGLang's health-check timeout (srt/entrypoints/http_server.py:218,
779-799), and answers 200 again once node 1 runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from sglang_supervisor.sim.gpus import sim_gpu_uuid
from tests.helpers import TAG_ENV, free_port, wait_until
from tests.slurmkit import SlurmCluster, node_processes

pytestmark = pytest.mark.slurm


def group_argv(job: str, port: int) -> list[str]:
    return [
        "srun",
        "--overlap",
        f"--jobid={job}",
        "-N2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--label",
        sys.executable,
        "-m",
        "sglang_supervisor.slurm.task",
        "--",
        sys.executable,
        "-m",
        "sglang_supervisor.sim.server",
        "--model-path",
        "sim/llama",
        "--tp-size",
        "4",
        "--nnodes",
        "2",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dist-init-addr",
        f"localhost:{free_port()}",
    ]


def group_env(registry: Path) -> dict[str, str]:
    visible = ",".join(f"{n}/{sim_gpu_uuid(i)}" for n in ("n1", "n2") for i in range(2))
    return {
        "SGLANG_SIM_GPU_DIR": str(registry),
        "SGLANG_SIM_GPU_DIR_PER_NODE": "1",
        "SGLANG_SIM_STARTUP_S": "0.1",
        "SGLANG_SIM_HEALTH_S": "0.05",
        "CUDA_VISIBLE_DEVICES": visible,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }


def test_a_frozen_second_node_stalls_the_leaders_generation(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "n1").mkdir()
    (tmp_path / "n2").mkdir()
    port = free_port()
    tag = f"sgs-test-collective-{os.getpid()}"
    url = f"http://127.0.0.1:{port}/health_generate"

    def health() -> int:
        return httpx.get(url, timeout=10, trust_env=False).status_code

    with slurm_cluster.allocation(2) as job:
        env = slurm_cluster.env(
            **group_env(tmp_path), SGLANG_HEALTH_CHECK_TIMEOUT="1", **{TAG_ENV: tag}
        )
        group = subprocess.Popen(
            group_argv(job, port), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        frozen: list[psutil.Process] = []
        try:
            wait_until(lambda: _answers(url), 60, 0.1, "the group ready")
            assert health() == 200
            frozen = node_processes(tag, "n2")
            assert frozen, "node 1's processes"
            for p in frozen:
                p.suspend()
            assert health() == 503  # SGLang's "Health check failed" after its timeout
            for p in frozen:
                p.resume()
            frozen = []
            wait_until(lambda: health() == 200, 30, 0.1, "generation again once node 1 runs")
        finally:
            for p in frozen:
                p.resume()
            group.kill()
            out = group.communicate(timeout=30)[0].decode(errors="replace")
    assert "Health check failed. Server couldn't get a response" in out, out[-2000:]


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def run_group(cluster: SlurmCluster, job: str, registry: Path) -> subprocess.CompletedProcess[str]:
    visible = ",".join(f"{n}/{sim_gpu_uuid(i)}" for n in ("n1", "n2") for i in range(2))
    return cluster.run(
        [
            "srun",
            "--overlap",
            f"--jobid={job}",
            "-N2",
            "--ntasks-per-node=1",
            "--kill-on-bad-exit=1",
            "--label",
            sys.executable,
            "-m",
            "sglang_supervisor.slurm.task",
            "--",
            sys.executable,
            "-m",
            "sglang_supervisor.sim.server",
            "--model-path",
            "sim/llama",
            "--tp-size",
            "4",
            "--nnodes",
            "2",
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--dist-init-addr",
            f"localhost:{free_port()}",
        ],
        timeout=60,
        SGLANG_SIM_GPU_DIR=str(registry),
        SGLANG_SIM_GPU_DIR_PER_NODE="1",
        SGLANG_SIM_STARTUP_S="0.1",
        CUDA_VISIBLE_DEVICES=visible,
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),
    )


def test_one_busy_gpu_on_the_second_node_fails_every_node(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "n1").mkdir()
    (tmp_path / "n2").mkdir()
    foreign = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        entry = {
            "pid": foreign.pid,
            "create_time": psutil.Process(foreign.pid).create_time(),
            "gpu_uuid": sim_gpu_uuid(1),
            "bytes": 10 * 2**30,
        }
        (tmp_path / "n2" / f"{foreign.pid}.json").write_text(json.dumps(entry))
        with slurm_cluster.allocation(2) as job:
            done = run_group(slurm_cluster, job, tmp_path)
    finally:
        foreign.kill()
        foreign.wait(10)
    assert done.returncode != 0
    lines = done.stdout.splitlines()
    unbalanced = [ln for ln in lines if "The memory capacity is unbalanced" in ln]
    # Both nodes fail, and node 0's line names the dirty node and the pid.
    assert {ln.split(":")[0].strip() for ln in unbalanced} == {"0", "1"}, done.stdout
    assert any(f"node 1: pid {foreign.pid} holds 10.0 GiB" in ln for ln in unbalanced)
    assert "fired up and ready" not in done.stdout
    assert os.listdir(tmp_path / "n1") == []  # no rank of node 0 holds memory
