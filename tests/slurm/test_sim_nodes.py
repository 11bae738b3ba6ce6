"""The simulated server on two Slurm nodes, run bare as one step (no daemon): start-up
couples the nodes, and one node's busy GPU fails the whole group with SGLang's
"The memory capacity is unbalanced" (sglang/srt/distributed/bootstrap.py:441-449)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from sglang_supervisor.sim.gpus import sim_gpu_uuid
from tests.helpers import free_port
from tests.slurmkit import SlurmCluster

pytestmark = pytest.mark.slurm


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
