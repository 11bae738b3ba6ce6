"""The one rule for the node levers (supervisor/slurm/settings.py): nnodes is a lever on
the slurm launcher within the allocation and dividing tp×pp; node_rank and dist_init_addr
are the launcher's; a server spanning hosts is refused on the local launcher."""

from __future__ import annotations

import pytest

from sglang_supervisor.slurm.allocation import allocation_nodes
from sglang_supervisor.slurm.settings import check_node_levers, node_lever_problems


def levers_named(problems: list[tuple[str, str]]) -> list[str]:
    return [lever for lever, _ in problems]


def test_two_nodes_within_a_two_node_allocation_pass() -> None:
    got = node_lever_problems(
        {"tp_size": 16, "nnodes": 2}, "slurm", allocation_nodes=2, gpus_per_node=8
    )
    assert got == []


def test_local_launcher_refuses_more_than_one_node_and_says_how() -> None:
    [(lever, message)] = node_lever_problems(
        {"tp_size": 16, "nnodes": 2}, "local", allocation_nodes=None
    )
    assert lever == "nnodes"
    assert 'server.launcher = "slurm"' in message and "--nnodes 2" in message
    assert node_lever_problems({"nnodes": 1}, "local", allocation_nodes=None) == []


def test_more_nodes_than_the_allocation_names_both_counts() -> None:
    [(lever, message)] = node_lever_problems(
        {"tp_size": 24, "nnodes": 3}, "slurm", allocation_nodes=2
    )
    assert lever == "nnodes"
    assert "--nnodes 3" in message and "2 nodes of this Slurm allocation" in message


def test_ranks_must_split_evenly_over_the_nodes() -> None:
    [(lever, message)] = node_lever_problems(
        {"tp_size": 6, "pp_size": 1, "nnodes": 4}, "slurm", allocation_nodes=4
    )
    assert lever == "nnodes" and "6 ranks do not split evenly over --nnodes 4" in message


def test_ranks_per_node_beyond_a_nodes_gpus() -> None:
    [(lever, message)] = node_lever_problems(
        {"tp_size": 16, "pp_size": 2, "nnodes": 2}, "slurm", allocation_nodes=2, gpus_per_node=8
    )
    assert lever == "tp_size" and "16 on each node" in message and "8 managed GPUs" in message


def test_node_rank_and_dist_init_addr_are_the_launchers() -> None:
    got = node_lever_problems(
        {"nnodes": 2, "tp_size": 2, "node_rank": 1, "dist_init_addr": "10.0.0.1:5000"},
        "slurm",
        allocation_nodes=2,
    )
    assert levers_named(got) == ["node_rank", "dist_init_addr"]
    assert all("cannot be set by a lever under launcher slurm" in m for _, m in got)


def test_facts_come_from_slurms_environment() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "2"}
    assert allocation_nodes(env) == 2 and allocation_nodes({}) is None
    # 16 managed GPUs over 2 nodes: 8 a node; tp 16 over 1 node is 16 on one node.
    [(lever, _)] = check_node_levers({"tp_size": 16, "nnodes": 1}, "slurm", 16, env)
    assert lever == "tp_size"
    assert check_node_levers({"tp_size": 16, "nnodes": 2}, "slurm", 16, env) == []


def test_the_deploy_example_config_loads_and_its_levers_pass_the_node_rule() -> None:
    from pathlib import Path

    from sglang_supervisor.config import load_settings

    path = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "slurm.example.toml"
    settings = load_settings(path, {})
    assert settings.server.launcher == "slurm"
    assert settings.slurm.probe_args == ["--gres=gpu:8"]
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "2"}
    assert check_node_levers(settings.server.levers, "slurm", 16, env) == []


def test_a_replicas_share_of_the_allocation_is_its_nodes() -> None:
    """Replicas in one allocation (docs/slurm.md): each daemon's share is its nodes, and
    nnodes is checked against its share (its managed GPUs' nodes), not the allocation."""
    from sglang_supervisor.host.gpu import GpuInfo
    from sglang_supervisor.slurm.allocation import Allocation, NotInAllocation, share_of
    from sglang_supervisor.slurm.settings import SlurmSettings

    alloc = Allocation("7", ("n1", "n2", "n3", "n4"))
    assert share_of(alloc, SlurmSettings(first_node=1, node_count=2)).nodes == ("n2", "n3")
    assert share_of(alloc, SlurmSettings(first_node=3)).nodes == ("n4",)
    with pytest.raises(NotInAllocation, match=r"has 4 nodes \(n1, n2, n3, n4\)"):
        share_of(alloc, SlurmSettings(first_node=3, node_count=2))
    managed = [GpuInfo(i, f"n2/GPU-{i}", "H200", 100) for i in range(8)]
    env = {"SLURM_JOB_NUM_NODES": "4"}
    [(lever, message)] = check_node_levers({"tp_size": 16, "nnodes": 2}, "slurm", managed, env)
    assert lever == "nnodes" and "more than the 1 nodes" in message
    assert check_node_levers({"tp_size": 8, "nnodes": 1}, "slurm", managed, env) == []
