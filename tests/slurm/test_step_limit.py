"""A job that runs out of steps (Slurm's ``MaxStepCount``, 40,000 per job by default), on a
two-node cluster of its own with ``MaxStepCount=3`` (scripts/slurm-cluster.sh,
``SLURM_CLUSTER_EXTRA_CONF``).

Steps 0 and 1 are the daemon's per-node presence and its server, and reads make no more:
the daemon answers any number of them. The first apply takes step 2; the next apply's
server step is refused ("Step limit reached for this job"): the apply says so in Slurm's
words, ``/status`` and the metrics count the refusal, and the daemon, which can never
start a server in this job again, exits 4 (the batch script's cue for a fresh
allocation) instead of holding the nodes.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import tagged_processes
from tests.slurm.test_slurm_daemon import slurm_daemon
from tests.slurmkit import SlurmCluster, find_cluster

pytestmark = pytest.mark.slurm
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm-cluster.sh"


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    find_cluster()  # skips (or fails under CI) where the test cluster cannot run
    where = tmp_path_factory.mktemp("limited")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CLUSTER_EXTRA_CONF"] = "MaxStepCount=3"
    got = subprocess.run(
        ["bash", str(SCRIPT), "start", str(where)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert got.returncode == 0, got.stderr
    try:
        yield SlurmCluster(where / "etc" / "slurm.conf")
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", str(where)], env=env, timeout=60, check=False)


def test_a_job_out_of_steps_is_said_and_the_daemon_exits_for_a_fresh_allocation(
    limited: SlurmCluster, tmp_path: Path
) -> None:
    with limited.allocation(2) as job:
        d = slurm_daemon(
            limited, job, tmp_path, {"tp_size": 4, "nnodes": 2}, timeouts={"release_timeout_s": 5}
        )
        try:
            d.start()
            for _ in range(20):  # each once made a step or two: a job of 3 would be done
                assert d.status()["state"] == "ready"
                assert d.client.get("/metrics").status_code == 200
            first = d.apply({"mem_fraction_static": 0.8}).json()["operation"]
            assert first["state"] == "succeeded", first
            second = d.apply({"mem_fraction_static": 0.75}).json()["operation"]
            said = str(second)
            assert second["state"] in ("rolled_back", "failed"), second
            assert "Step limit reached for this job" in said, said
            assert d.proc is not None
            rc = d.proc.wait(120)
            log = d.log()
            assert rc == 4, log[-3000:]
            assert "Slurm refused the server's job step" in log
            assert "this allocation can no longer host the server" in log
        finally:
            if d.proc is not None and d.proc.poll() is None:
                d.stop()
            d.client.close()
        assert tagged_processes(d.instance) == []
