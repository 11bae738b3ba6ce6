"""What each task of the server's step renders on its node (supervisor/slurm/task.py)."""

from __future__ import annotations

import pytest

from sglang_supervisor.slurm.launcher import nnodes_of
from sglang_supervisor.slurm.task import node_argv, node_gpus


def test_each_node_keeps_its_own_gpus_without_the_node() -> None:
    visible = "n1/GPU-a,n1/GPU-b,n2/GPU-a,n2/GPU-b"
    assert node_gpus(visible, "n1") == "GPU-a,GPU-b"
    assert node_gpus(visible, "n2") == "GPU-a,GPU-b"
    assert node_gpus(visible, "n3") == ""
    assert node_gpus("0,1", "n1") == "0,1"  # no node named: left as it is


def test_node_rank_comes_from_slurm_and_gpus_are_narrowed() -> None:
    env = {"SLURM_NODEID": "1", "SLURMD_NODENAME": "n2", "CUDA_VISIBLE_DEVICES": "n1/A,n2/B"}
    argv, new_env = node_argv(["python", "-m", "x", "--nnodes", "2"], env)
    assert argv == ["python", "-m", "x", "--nnodes", "2", "--node-rank", "1"]
    assert new_env["CUDA_VISIBLE_DEVICES"] == "B"


def test_outside_a_step_the_task_refuses() -> None:
    with pytest.raises(ValueError, match="SLURM_NODEID/SLURMD_NODENAME are not set"):
        node_argv(["x"], {})


def test_nnodes_is_read_from_the_servers_flags() -> None:
    assert nnodes_of(["--tp-size", "16", "--nnodes", "2"]) == 2
    assert nnodes_of(["--nnodes=3"]) == 3
    assert nnodes_of(["--tp-size", "8"]) == 1
