"""The real daemon in --simulate mode with launcher = "slurm", inside a real allocation of
the two-node test cluster (scripts/slurm-cluster.sh): the server is one job step named by
its launch tag, GPUs are every node's (simulated per node), a lever change is a new step,
a foreign process on the second node's GPU is refused naming the node and the pid."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from sglang_supervisor.sim.gpus import sim_gpu_uuid
from sglang_supervisor.slurm.presence import PRESENCE_NAME
from tests.helpers import Daemon, free_port, tagged_processes, wait_until
from tests.slurmkit import SlurmCluster

pytestmark = pytest.mark.slurm


def slurm_daemon(
    cluster: SlurmCluster,
    job: str,
    tmp: Path,
    levers: dict[str, Any],
    gpus: int = 2,
    timeouts: dict[str, Any] | None = None,
    sim: dict[str, Any] | None = None,
    slurm: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    cls: type[Daemon] = Daemon,
) -> Daemon:
    # Short waits on the nodes: a sample every 0.5 s, a question answered within 3 s, a
    # node stuck after 2 s (the shipped defaults are 1 s, 5 s, 10 s).
    fast = {"sample_interval_s": 0.5, "probe_timeout_s": 3.0, "stuck_after_s": 2.0}
    d = cls(
        tmp,
        gpus=gpus,
        sim=sim,
        levers={"model_path": "sim/llama", "mem_fraction_static": 0.85, **levers},
        timeouts={"ready_timeout_s": 60.0, "release_timeout_s": 30.0, **(timeouts or {})},
        extra={
            "server": {"launcher": "slurm"},
            "slurm": {"dist_init_port": free_port(), **fast, **(slurm or {})},
            **(extra or {}),
        },
    )
    d.env = {"SLURM_CONF": str(cluster.conf), "SLURM_JOB_ID": job}
    return d


@pytest.fixture
def allocation(slurm_cluster: SlurmCluster) -> Iterator[str]:
    with slurm_cluster.allocation(2) as job:
        yield job


@pytest.fixture
def one_node(slurm_cluster: SlurmCluster, allocation: str, tmp_path: Path) -> Iterator[Daemon]:
    d = slurm_daemon(slurm_cluster, allocation, tmp_path, {"tp_size": 2})
    try:
        yield d.start()
    finally:
        stop_and_check(slurm_cluster, allocation, d)


def stop_and_check(cluster: SlurmCluster, job: str, d: Daemon) -> None:
    """The daemon's exit leaves no step and no process of ours on any node."""
    if d.proc is not None and d.proc.poll() is None:
        assert d.stop() == 0, d.log()
    d.client.close()
    assert cluster.steps(job) == []
    assert tagged_processes(d.instance) == []


def step_names(cluster: SlurmCluster, job: str) -> list[str]:
    out = cluster.run(["squeue", "-h", "-s", "-j", job, "-o", "%j"]).stdout.split()
    return [n for n in out if n not in (PRESENCE_NAME, "batch")]


def server_info(d: Daemon) -> dict[str, Any]:
    url = d.status()["server"]["url"]
    info: dict[str, Any] = httpx.get(f"{url}/server_info", timeout=5, trust_env=False).json()
    return info


def test_start_is_one_step_and_gpus_are_every_nodes(
    slurm_cluster: SlurmCluster, allocation: str, one_node: Daemon
) -> None:
    s = one_node.status()
    assert s["state"] == "ready"
    # The server is a step of the allocation named by its launch tag; our handle is srun.
    assert step_names(slurm_cluster, allocation) == [s["server"]["launch_tag"]]
    assert psutil.Process(s["server"]["pid"]).name() == "srun"
    # 2 simulated GPUs on each node: the first node's hold the two ranks.
    gpus = s["gpus"]
    assert len(gpus) == 4
    assert [len(g["processes"]) for g in gpus] == [1, 1, 0, 0]
    assert all(p["member"] for g in gpus for p in g["processes"])


def test_apply_is_a_new_step_with_the_new_levers(
    slurm_cluster: SlurmCluster, allocation: str, one_node: Daemon
) -> None:
    before = one_node.status()["server"]
    t0 = time.monotonic()
    r = one_node.apply({"mem_fraction_static": 0.8})
    took = time.monotonic() - t0
    op = r.json()["operation"]
    assert op["state"] == "succeeded", op
    after = one_node.status()["server"]
    assert after["launch_tag"] != before["launch_tag"]
    assert step_names(slurm_cluster, allocation) == [after["launch_tag"]]
    assert server_info(one_node)["mem_fraction_static"] == 0.8
    print(f"two-GPU apply through the slurm launcher: {took:.2f}s")


def test_a_dead_rank_brings_the_step_back_whole(
    slurm_cluster: SlurmCluster, allocation: str, one_node: Daemon
) -> None:
    before = one_node.status()
    rank = before["gpus"][1]["processes"][0]["pid"]
    t0 = time.monotonic()
    psutil.Process(rank).kill()

    def back() -> dict[str, Any] | None:
        s = one_node.status_or_none()
        if (
            s
            and s["state"] == "ready"
            and s["operation"] is None  # the recovery has ended (counted, committed)
            and s["server"]["launch_tag"] != before["server"]["launch_tag"]
        ):
            return s
        return None

    s = wait_until(back, 60, 0.1, "the step restarted and ready")
    print(f"group recovery after a rank's SIGKILL: {time.monotonic() - t0:.2f}s")
    assert s["restarts"] >= 1
    assert step_names(slurm_cluster, allocation) == [s["server"]["launch_tag"]]
    assert not psutil.pid_exists(rank)


def test_foreign_process_on_the_second_nodes_gpu_is_named_with_its_node(
    one_node: Daemon,
) -> None:
    pid = one_node.status()["server"]["pid"]
    foreign = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        registry = one_node.dir / "state" / "sim-gpus" / "n2"
        entry = {
            "pid": foreign.pid,
            "create_time": psutil.Process(foreign.pid).create_time(),
            "gpu_uuid": sim_gpu_uuid(1),
            "bytes": 10 * 2**30,
        }
        (registry / f"{foreign.pid}.json").write_text(json.dumps(entry))
        r = one_node.apply({"mem_fraction_static": 0.8})
        assert r.status_code == 422, r.text
        assert f"pid {foreign.pid} holds 10.0 GiB on GPU 3 (node n2)" in r.text
        assert one_node.status()["server"]["pid"] == pid
        assert foreign.poll() is None, "a foreign process must never be killed"
    finally:
        foreign.kill()
        foreign.wait(10)


def test_a_dirty_gpu_at_start_is_said_and_the_start_retried_once_it_is_clean(
    slurm_cluster: SlurmCluster, allocation: str, tmp_path: Path
) -> None:
    """A process not ours holds a GPU of n2 when the daemon starts: the state's reason
    names it with its node (it said "daemon started"), /status start_refused and the
    metric say so, and once it leaves the start is retried without an operator."""
    foreign = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    d = slurm_daemon(slurm_cluster, allocation, tmp_path, {"tp_size": 2})
    registry = d.dir / "state" / "sim-gpus" / "n2"
    registry.mkdir(parents=True)
    entry = {
        "pid": foreign.pid,
        "create_time": psutil.Process(foreign.pid).create_time(),
        "gpu_uuid": sim_gpu_uuid(1),
        "bytes": 10 * 2**30,
    }
    (registry / f"{foreign.pid}.json").write_text(json.dumps(entry))
    try:
        d.start(wait_ready=False)
        s = wait_until(
            lambda: (s := d.status_or_none()) and s.get("start_refused") and s, 60, 0.1, "refused"
        )
        assert s["state"] == "stopped"
        assert f"pid {foreign.pid} holds 10.0 GiB on GPU 3 (node n2)" in s["state_reason"]
        assert "sglang_supervisor_start_refused 1.0" in d.client.get("/metrics").text
        foreign.kill()
        foreign.wait(10)
        s = d.wait_state("ready", 60)
        assert s["start_refused"] is None
    finally:
        if foreign.poll() is None:
            foreign.kill()
            foreign.wait(10)
        stop_and_check(slurm_cluster, allocation, d)
