"""A leftover of ours on the second node — a tagged process that escaped its step, as
``proctrack/linuxproc`` lets a re-parented process do — is swept by that node's probe
before the daemon starts its server; the sweep is per node (each node answers for its
own processes, even where the test cluster's nodes share a host)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from tests.helpers import TAG_ENV, wait_until
from tests.slurm.test_slurm_daemon import slurm_daemon, stop_and_check
from tests.slurmkit import SlurmCluster

pytestmark = pytest.mark.slurm


def leave_behind(cluster: SlurmCluster, job: str, node: str, tag: str) -> int:
    """A tagged process on ``node`` that outlives the step that started it."""
    got = cluster.run(
        [
            "srun",
            "--overlap",
            f"--jobid={job}",
            "-N1",
            f"--nodelist={node}",
            "bash",
            "-c",
            "setsid sleep 300 >/dev/null 2>&1 < /dev/null & echo $!",
        ],
        **{TAG_ENV: tag},
    )
    assert got.returncode == 0, got.stderr
    pid = int(got.stdout.split()[-1])
    assert psutil.Process(pid).is_running()
    return pid


def test_a_leftover_on_the_second_node_is_swept_before_the_start(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    with slurm_cluster.allocation(2) as job:
        d = slurm_daemon(slurm_cluster, job, tmp_path, {"tp_size": 4, "nnodes": 2})
        leftover = leave_behind(slurm_cluster, job, "n2", f"{d.instance}.earlier")
        try:
            # The step that started it is over; the process is still there.
            wait_until(lambda: slurm_cluster.steps(job) == [], 10, 0.1, "the step ended")
            assert psutil.pid_exists(leftover)
            d.start()
            assert not psutil.pid_exists(leftover), "the leftover on n2 was not swept"
            assert d.status()["state"] == "ready"
        finally:
            stop_and_check(slurm_cluster, job, d)
            if psutil.pid_exists(leftover):
                psutil.Process(leftover).kill()
