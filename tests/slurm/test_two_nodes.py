"""One server across the two nodes of the test cluster, through the real daemon in
--simulate mode with launcher = "slurm": tp_size 16, nnodes 2, 8 simulated GPUs per node.

What a user sees: one job step with a task per node; every node's GPUs held by our ranks;
a lever change stops the group leader first (node 1 leaves on node 0's shutdown
broadcast, never on a SIGTERM of its own) and starts a new step; a rank SIGKILLed on the
second node brings the whole group back (no half group); a foreign process on the second
node's GPU refuses the change naming the node and the pid; a plain ``scancel`` of the
job leaves nothing on any node and the daemon exits 4 (the allocation cannot host the
server any more). Over the allocation's life: reads and scrapes make no job step (counted
from Slurm's own step ids), an apply only the server's; /status and /metrics answer from
each node's last sample while a node is frozen; a frozen node of the server's group is
found, named, and the whole group recovered.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from sglang_supervisor.sim.gpus import sim_gpu_uuid
from tests.helpers import Daemon, tagged_processes, wait_until
from tests.slurm.test_slurm_daemon import server_info, slurm_daemon, step_names, stop_and_check
from tests.slurmkit import SlurmCluster, node_processes, presence_task

pytestmark = pytest.mark.slurm
LEVERS = {"tp_size": 16, "nnodes": 2}


@pytest.fixture(scope="module")
def group(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Daemon, str]]:
    with slurm_cluster.allocation(2) as job:
        d = slurm_daemon(slurm_cluster, job, tmp_path_factory.mktemp("group"), LEVERS, gpus=8)
        t0 = time.monotonic()
        try:
            d.start()
            print(f"\ntwo-node start (daemon start to ready): {time.monotonic() - t0:.2f}s")
            yield d, job
        finally:
            stop_and_check(slurm_cluster, job, d)


def holders(s: dict[str, Any]) -> list[list[int]]:
    return [[p["pid"] for p in g["processes"] if p["member"]] for g in s["gpus"]]


def test_one_step_and_every_nodes_gpus_held(
    slurm_cluster: SlurmCluster, group: tuple[Daemon, str]
) -> None:
    d, job = group
    s = d.status()
    assert s["state"] == "ready"
    assert step_names(slurm_cluster, job) == [s["server"]["launch_tag"]]
    assert len(s["gpus"]) == 16
    assert [g["node"] for g in s["gpus"]] == ["n1"] * 8 + ["n2"] * 8
    assert s["gpus"][8]["uuid"] == "n2/GPU-00000000-5151-4000-8000-000000000000"
    assert [(n["name"], n["gpus"]) for n in s["nodes"]] == [
        ("n1", list(range(8))),
        ("n2", list(range(8, 16))),
    ]
    assert all(n["memory_used_bytes"] > 0 for n in s["nodes"])
    metrics = d.client.get("/metrics").text
    assert 'sglang_supervisor_gpu_memory_used_bytes{gpu="13",node="n2"}' in metrics
    assert all(len(h) == 1 for h in holders(s)), holders(s)


def test_reads_and_scrapes_make_no_job_step_and_an_apply_only_the_servers(
    slurm_cluster: SlurmCluster, group: tuple[Daemon, str]
) -> None:
    """Slurm's MaxStepCount is per job (40,000 by default): a step per question, as
    before the per-node presence, used it up in days. Counted from Slurm's own step ids."""
    d, job = group
    a = slurm_cluster.step_id(job)
    for _ in range(10):
        assert d.status()["state"] == "ready"
    for _ in range(3):
        assert d.client.get("/metrics").status_code == 200
    b = slurm_cluster.step_id(job)
    op = d.apply({"mem_fraction_static": 0.83}).json()["operation"]
    assert op["state"] == "succeeded", op
    c = slurm_cluster.step_id(job)
    print(f"\nsteps made by 10 /status + 3 /metrics: {b - a - 1}; by one apply: {c - b - 1}")
    assert b - a - 1 == 0
    assert c - b - 1 == 1  # the new server's own step
    slurm = d.status()["slurm"]
    assert slurm["presence"]["state"] == "up" and slurm["presence"]["launches"] == 1
    metrics = d.client.get("/metrics").text
    assert 'sglang_supervisor_slurm_steps_made_total{kind="presence"} 1.0' in metrics


def test_status_and_metrics_answer_from_the_last_sample_while_a_node_is_frozen(
    group: tuple[Daemon, str],
) -> None:
    """The presence's task on n2 stopped (SIGSTOP: a sick node, its slurmstepd stuck):
    /status and /metrics answer from n2's last sample with its age (never waiting on the
    node); an apply is refused before anything stops, naming n2; resumed, n2 samples
    again. The server itself is untouched throughout. (n2's slurmd is left alone: the
    presence talks through its step's slurmstepd, and the tests beside this one need it.)"""
    d, _ = group
    before = d.status()
    frozen = [presence_task(d.instance, "n2")]
    for p in frozen:
        p.suspend()
    try:
        wait_until(
            lambda: d.status()["nodes"][1]["sample_age_s"] > 3, 30, 0.2, "n2's sample ageing"
        )
        took: list[float] = []
        for _ in range(5):
            t0 = time.monotonic()
            s = d.status()
            took.append(time.monotonic() - t0)
            t0 = time.monotonic()
            metrics = d.client.get("/metrics").text
            took.append(time.monotonic() - t0)
        print(f"\n/status and /metrics with n2 frozen: at most {max(took) * 1000:.0f} ms")
        assert s["state"] == "ready" and s["server"]["pid"] == before["server"]["pid"]
        n1, n2 = s["nodes"]
        assert n1["sample_age_s"] < 2 and n2["sample_age_s"] > 3, s["nodes"]
        assert not [g for g in s["gpus"] if "error" in g]  # n2's last sample is shown
        age = re.search(r'slurm_node_sample_age_seconds\{node="n2"\} (\S+)', metrics)
        assert age is not None and float(age.group(1)) > 3
        r = d.apply({"mem_fraction_static": 0.79})
        assert r.status_code == 422, r.text
        assert "n2 did not answer the per-node presence within 3s" in r.text
        assert d.status()["server"]["pid"] == before["server"]["pid"]
    finally:
        for p in frozen:
            p.resume()
    wait_until(lambda: d.status()["nodes"][1]["sample_age_s"] < 1.5, 30, 0.2, "n2 sampling")
    s = d.status()
    assert s["server"]["pid"] == before["server"]["pid"]
    assert s["slurm"]["presence"]["launches"] == 1


def test_a_frozen_node_is_found_and_the_whole_group_recovered_naming_it(
    slurm_cluster: SlurmCluster, group: tuple[Daemon, str]
) -> None:
    """Every process of the server's task on n2 stopped (SIGSTOP: as an NCCL hang, an Xid
    or a D state leaves a node): the leader's generation waits on n2 as a collective does
    (supervisor/sim/nodes.py), so nothing on node 0 says why. The daemon finds n2 in its
    samples, names it and recovers the whole group; freeze -> noticed -> ready measured."""
    d, job = group
    before = d.status()
    tag = before["server"]["launch_tag"]
    old = {p for h in holders(before) for p in h}
    frozen = node_processes(tag, "n2")
    assert len(frozen) >= 2, frozen  # the node's launcher and its ranks
    t0 = time.monotonic()
    for p in frozen:
        p.suspend()
    try:
        noticed = wait_until(
            lambda: (s := d.status_or_none()) is not None and s["state"] != "ready" and s,
            60,
            0.05,
            "the frozen node noticed",
        )
        t_noticed = time.monotonic() - t0

        def back() -> dict[str, Any] | None:
            s = d.status_or_none()
            if s and s["state"] == "ready" and s["operation"] is None:
                return s if s["server"]["launch_tag"] != tag else None
            return None

        s = wait_until(back, 120, 0.1, "a new group ready")
        t_ready = time.monotonic() - t0
    finally:
        for p in frozen:
            if p.is_running():
                p.resume()
    print(
        f"\nfrozen n2: noticed after {t_noticed:.2f}s ({noticed['state']}), "
        f"a new group ready after {t_ready:.2f}s"
    )
    assert step_names(slurm_cluster, job) == [s["server"]["launch_tag"]]
    assert not [p for p in old if psutil.pid_exists(p)], "no half group left"
    op = d.client.get(f"/operations/{s['last_operation']['id']}").json()["operation"]
    said = json.dumps(op)
    assert op["kind"] == "recover" and "node n2" in said, said
    assert s["restarts_by_reason"].get("hung", 0) >= 1


def test_status_page_shows_the_gpus_node_by_node(group: tuple[Daemon, str]) -> None:
    from tests.cdp import Browser, find_chromium

    chromium = find_chromium()
    if chromium is None:
        pytest.skip("needs Debian's chromium (scripts/test.sh installs it)")
    d, _ = group
    browser = Browser(chromium)
    try:
        p = browser.page()
        p.goto(d.url + "/")
        p.wait("document.querySelectorAll('#gpus .gpu').length === 16", 30, "16 GPUs shown")
        heads = p.js("[...document.querySelectorAll('#gpus .node-head')].map(e => e.innerText)")
        assert heads == ["node n1", "node n2"]
        # Each heading comes right before its node's first GPU.
        first = p.js(
            "[...document.querySelectorAll('#gpus .node-head')]"
            ".map(e => e.nextElementSibling.dataset.index)"
        )
        assert first == ["0", "8"]
    finally:
        browser.close()


def test_apply_stops_the_leader_first_and_starts_a_new_step(
    slurm_cluster: SlurmCluster, group: tuple[Daemon, str]
) -> None:
    d, job = group
    before = d.status()["server"]
    t0 = time.monotonic()
    op = d.apply({"mem_fraction_static": 0.8}).json()["operation"]
    print(f"\ntwo-node apply (POST /levers?wait=true): {time.monotonic() - t0:.2f}s")
    assert op["state"] == "succeeded", op
    after = d.status()
    assert after["server"]["launch_tag"] != before["launch_tag"]
    assert step_names(slurm_cluster, job) == [after["server"]["launch_tag"]]
    assert server_info(d)["mem_fraction_static"] == 0.8
    assert all(len(h) == 1 for h in holders(after))
    old_log = Path(before["log_path"]).read_text()
    assert "Shutdown broadcast from node 0: stopping" in old_log
    assert "Received SIGTERM on node 1" not in old_log


def test_foreign_process_on_the_second_node_refuses_naming_node_and_pid(
    group: tuple[Daemon, str],
) -> None:
    d, _ = group
    pid = d.status()["server"]["pid"]
    foreign = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        entry = {
            "pid": foreign.pid,
            "create_time": psutil.Process(foreign.pid).create_time(),
            "gpu_uuid": sim_gpu_uuid(5),
            "bytes": 10 * 2**30,
        }
        registry = d.dir / "state" / "sim-gpus" / "n2"
        (registry / f"{foreign.pid}.json").write_text(json.dumps(entry))
        r = d.apply({"mem_fraction_static": 0.75})
        assert r.status_code == 422, r.text
        assert f"pid {foreign.pid} holds 10.0 GiB on GPU 13 (node n2)" in r.text
        assert d.status()["server"]["pid"] == pid
        assert foreign.poll() is None, "a foreign process must never be killed"
    finally:
        foreign.kill()
        foreign.wait(10)


def test_a_foreign_listener_on_the_rendezvous_port_refuses_naming_port_and_pid(
    group: tuple[Daemon, str],
) -> None:
    d, _ = group
    port = tomllib.loads(d.config_path.read_text())["slurm"]["dist_init_port"]
    assert d.client.post("/stop", params={"wait": "true"}).json()["operation"]["state"] == (
        "succeeded"
    )
    with socket.create_server(("127.0.0.1", port)):
        r = d.apply({"mem_fraction_static": 0.78})
        assert r.status_code == 422, r.text
        problem = r.json()["detail"]["problems"][0]
        assert problem["lever"] == "slurm.dist_init_port"
        assert f"port {port} on node n1" in problem["message"]
        assert f"pid {os.getpid()}" in problem["message"]
        assert d.status()["state"] == "stopped"
    op = d.client.post("/start", params={"wait": "true"}).json()["operation"]
    assert op["state"] == "succeeded", op


def test_a_gpu_taken_between_preflight_and_start_is_named_with_its_node_and_pid(
    group: tuple[Daemon, str],
) -> None:
    """A foreign process takes a GPU of n2 after the apply's preflight and release passed
    (as the new group starts): SGLang fails every node with "The memory capacity is
    unbalanced" and the start exits 1. The apply's outcome names the node and the pid, as
    the preflight would have (it said only "exited with code 1 during start")."""
    d, _ = group
    foreign = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    entry = {
        "pid": foreign.pid,
        "create_time": psutil.Process(foreign.pid).create_time(),
        "gpu_uuid": sim_gpu_uuid(5),
        "bytes": 10 * 2**30,
    }
    try:
        op_id = d.apply({"mem_fraction_static": 0.77}, wait=False).json()["operation"]["id"]
        wait_until(lambda: d.status()["state"] == "starting", 30, 0.02, "the new group starting")
        registry = d.dir / "state" / "sim-gpus" / "n2"
        (registry / f"{foreign.pid}.json").write_text(json.dumps(entry))

        def ended() -> dict[str, Any] | None:
            op = d.client.get(f"/operations/{op_id}").json()["operation"]
            return op if op["state"] != "running" else None

        op = wait_until(ended, 120, 0.2, "the apply ended")
        said = json.dumps(op)
        assert op["state"] in ("rolled_back", "failed"), op
        assert "The memory capacity is unbalanced" in said, said
        assert f"pid {foreign.pid} holds 10.0 GiB on GPU 13 (node n2)" in said, said
    finally:
        foreign.kill()
        foreign.wait(10)
    # The rollback's start may have met the foreign process too: the group comes back.
    s = wait_until(
        lambda: (s := d.status_or_none()) and s["operation"] is None and s, 120, 0.1, "settled"
    )
    if s["state"] != "ready":
        started = d.client.post("/start", params={"wait": "true"}).json()["operation"]
        assert started["state"] == "succeeded", started
    assert d.status()["state"] == "ready"


def test_an_apply_failing_at_start_rolls_the_group_back(
    slurm_cluster: SlurmCluster, group: tuple[Daemon, str]
) -> None:
    d, job = group
    before = d.status()
    op = d.apply({"mem_fraction_static": 0.7}, env={"SGLANG_SIM_FAULTS": "crash_on_start"})
    done = op.json()["operation"]
    assert done["state"] == "rolled_back", done
    s = d.status()
    assert s["state"] == "ready" and s["levers"] == before["levers"]
    assert server_info(d)["mem_fraction_static"] == before["levers"]["mem_fraction_static"]
    assert step_names(slurm_cluster, job) == [s["server"]["launch_tag"]]
    assert all(len(h) == 1 for h in holders(s)), holders(s)


def test_a_rank_killed_on_the_second_node_brings_the_whole_group_back(
    slurm_cluster: SlurmCluster, group: tuple[Daemon, str]
) -> None:
    d, job = group
    before = d.status()
    old = {p for h in holders(before) for p in h}
    victim = holders(before)[12][0]  # a rank on n2
    t0 = time.monotonic()
    psutil.Process(victim).kill()

    def back() -> dict[str, Any] | None:
        s = d.status_or_none()
        if (
            s
            and s["state"] == "ready"
            and s["operation"] is None  # the recovery has ended (counted, committed)
            and s["server"]["launch_tag"] != before["server"]["launch_tag"]
        ):
            return s
        return None

    s = wait_until(back, 90, 0.1, "the group back and ready")
    print(f"\ntwo-node group recovery after a rank's SIGKILL on n2: {time.monotonic() - t0:.2f}s")
    assert step_names(slurm_cluster, job) == [s["server"]["launch_tag"]]
    assert all(len(h) == 1 for h in holders(s))
    # No half group: every rank of the old group, on both nodes, is gone.
    assert not [p for p in old if psutil.pid_exists(p)]


def test_scancel_of_the_job_leaves_nothing_and_the_daemon_exits_for_a_fresh_allocation(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """After the job is gone Slurm refuses every step: the daemon must not hold on in
    ``failed`` (it held the nodes forever); it exits 4, which the batch script turns into
    a fresh allocation."""
    with slurm_cluster.allocation(2) as job:
        d = slurm_daemon(
            slurm_cluster,
            job,
            tmp_path,
            {"tp_size": 4, "nnodes": 2},
            timeouts={"release_timeout_s": 5.0},
        )
        try:
            d.start()
            assert d.status()["state"] == "ready"
            got = slurm_cluster.run(["scancel", job])
            assert got.returncode == 0, got.stderr
            wait_until(lambda: tagged_processes(d.instance) == [], 30, 0.1, "nothing left")
            # The presence ignores SIGTERM (the daemon's stop still needs the nodes): it
            # goes at Slurm's SIGKILL, KillWait (5 s here) after the TERM.
            wait_until(lambda: slurm_cluster.steps(job) == [], 30, 0.2, "no step left")
            assert d.proc is not None
            rc = d.proc.wait(120)
            log = d.log()
            print(f"\nafter scancel: exit {rc}; " + log[log.find("this allocation") - 300 :][:600])
            assert rc == 4, log[-3000:]
            assert "this allocation can no longer host the server" in log
        finally:
            if d.proc is not None and d.proc.poll() is None:
                d.stop()
            d.client.close()
        assert tagged_processes(d.instance) == []


def test_daemon_sigterm_while_the_group_starts_leaves_nothing(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """A shutdown in the middle of a two-node start: the daemon stops the half-started
    group (every node), exits 0, and no step or process of ours is left."""
    with slurm_cluster.allocation(2) as job:
        # A long model load: the group is still starting when the daemon is stopped.
        d = slurm_daemon(
            slurm_cluster, job, tmp_path, {"tp_size": 4, "nnodes": 2}, sim={"startup_s": 30}
        )
        try:
            d.start(wait_ready=False)
            wait_until(
                lambda: (
                    (s := d.status_or_none()) is not None
                    and s["state"] == "starting"
                    and s["server"] is not None
                ),
                60,
                0.1,
                "the group starting",
            )
            wait_until(lambda: step_names(slurm_cluster, job) != [], 30, 0.1, "the step")
            t0 = time.monotonic()
            assert d.status()["state"] == "starting"
            assert d.stop() == 0, d.log()
            print(f"\ndaemon stop during a two-node start: {time.monotonic() - t0:.2f}s")
            assert slurm_cluster.steps(job) == []
            assert tagged_processes(d.instance) == []
        finally:
            stop_and_check(slurm_cluster, job, d)
