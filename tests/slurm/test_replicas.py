"""Replicas in one allocation, changed without downtime (issue 28 §7): the two nodes of
one allocation each host a replica (``slurm.first_node`` 0 and 1, ``node_count`` 1), each
owned by its own daemon run as its own job step on its node, behind the real
sglang-router; ``sglang-supervisor rollout`` changes a lever across them while streaming
clients run through the router: no request fails or is cut, each replica's server is a
step on its own node, and both serve the new levers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.benchmarks.router_load import Load, LoadSpec, window_stats
from tests.helpers import TAG_ENV, Daemon, wait_until
from tests.routerkit import Router, needs_router
from tests.slurm.test_slurm_daemon import slurm_daemon
from tests.slurmkit import SlurmCluster

pytestmark = [pytest.mark.slurm, needs_router()]
#: The simulated servers: 20 tokens/s, so a request of 10-30 tokens lasts 0.5-1.5 s.
SERVER_ENV = {
    "SGLANG_SIM_TOKENS_PER_S": "20",
    "SGLANG_SIM_HEALTH_S": "0.2",
    "SGLANG_SIM_DRAIN_CHECK_S": "0.5",
}


class StepDaemon(Daemon):
    """A replica's daemon as its own job step on its node (``srun --overlap -N1 -w``)."""

    cluster: SlurmCluster
    job = ""
    node = ""

    def spawn(self) -> subprocess.Popen[bytes]:
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        argv = [
            "srun", "--overlap", f"--jobid={self.job}", "-N1", "-n1", f"--nodelist={self.node}",
            f"--job-name=sglang-supervisor-{self.node}",
            sys.executable, "-m", "sglang_supervisor_api.cli", "serve",
            "--config", str(self.config_path),
        ]  # fmt: skip
        env = self.cluster.env(**SERVER_ENV)
        env.pop(TAG_ENV, None)
        self.proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
        log.close()
        return self.proc

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM to the daemon's task alone (``scancel -s TERM`` of its step: srun's own
        SIGTERM would end the step, the daemon within ``KillWait``), its exit awaited."""
        assert self.proc is not None
        if self.proc.poll() is None:
            for step in step_ids(self.cluster, self.job, f"sglang-supervisor-{self.node}"):
                self.cluster.run(["scancel", "-s", "TERM", step])
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                raise AssertionError(
                    f"daemon ignored SIGTERM for {timeout}s:\n{self.log()}"
                ) from None
        return self.proc.returncode


def step_ids(cluster: SlurmCluster, job: str, name: str) -> list[str]:
    out = cluster.run(["squeue", "-h", "-s", "-j", job, "-o", "%i %j"]).stdout.splitlines()
    return [line.split()[0] for line in out if line.split()[1:] == [name]]


def replica(
    cluster: SlurmCluster, job: str, tmp: Path, k: int, node: str, router: Router
) -> StepDaemon:
    home = tmp / f"replica{k}"
    home.mkdir()
    d = slurm_daemon(
        cluster,
        job,
        home,
        {"tp_size": 2},
        slurm={"first_node": k, "node_count": 1},
        timeouts={"probation_s": 0.5},
        extra={"router": {"url": router.url, "drain_timeout_s": 60.0, "drain_poll_s": 0.25}},
        cls=StepDaemon,
    )
    assert isinstance(d, StepDaemon)
    d.cluster, d.job, d.node = cluster, job, node
    return d


def rollout(daemons: list[Daemon]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "sglang_supervisor_api.cli", "rollout"]
    argv += ["--set", "mem_fraction_static=0.8"]
    for d in daemons:
        argv += ["--daemon", d.url]
    env = {k: v for k, v in os.environ.items() if not k.endswith("_proxy")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, check=False)


async def under_load(url: str, daemons: list[Daemon]) -> tuple[int, str, dict[str, int], int]:
    load = Load(url, LoadSpec(concurrency=6, min_tokens=10, max_tokens=30))
    runner = asyncio.create_task(load.run())
    await asyncio.sleep(3.0)
    t0 = time.monotonic()
    done = await asyncio.to_thread(rollout, daemons)
    t1 = time.monotonic()
    await asyncio.sleep(2.0)
    load.stop()
    await asyncio.wait_for(runner, timeout=120)
    during = [o for o in load.outcomes if t0 <= o.started < t1]
    total = window_stats(load.outcomes)
    print(
        f"\nrollout across 2 replicas in one allocation: {t1 - t0:.1f}s; "
        f"{total['requests']} requests ({len(during)} during it), "
        f"{total['failed']} failed, {total['truncated']} truncated"
    )
    return done.returncode, done.stdout + done.stderr, total, len(during)


def test_a_rollout_across_replicas_in_one_allocation_fails_and_cuts_nothing(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    router = Router(tmp_path / "router.log")
    daemons: list[StepDaemon] = []
    codes: list[int] = []
    with slurm_cluster.allocation(2) as job:
        try:
            for k, node in enumerate(("n1", "n2")):
                daemons.append(replica(slurm_cluster, job, tmp_path, k, node, router))
            for d in daemons:
                d.start(wait_ready=False)
            for d in daemons:
                d.wait_state("ready", 90)
            wait_until(
                lambda: len([w for w in router.workers() if w.get("is_healthy", True)]) == 2,
                60,
                0.2,
                "both replicas in the router",
            )
            # Each replica's server is a step of the allocation on its own node.
            steps = slurm_cluster.run(["squeue", "-h", "-s", "-j", job, "-o", "%j %N"]).stdout
            for d in daemons:
                tag = d.status()["server"]["launch_tag"]
                assert f"{tag} {d.node}" in steps, steps
                assert [g["node"] for g in d.status()["gpus"]] == [d.node, d.node]
            code, said, total, during = asyncio.run(under_load(router.url, daemons))
            assert code == 0, said
            assert during > 0
            assert (total["failed"], total["truncated"]) == (0, 0), total
            for d in daemons:
                s = d.status()
                assert s["levers"]["mem_fraction_static"] == 0.8
                info = httpx.get(f"{s['server']['url']}/server_info", timeout=5, trust_env=False)
                assert info.json()["mem_fraction_static"] == 0.8
        finally:
            codes = [d.stop(timeout=120) for d in daemons if d.proc is not None]
            for d in daemons:
                d.client.close()
            router.stop()
        assert codes == [0, 0], [d.log()[-2000:] for d in daemons]
        assert slurm_cluster.steps(job) == []
