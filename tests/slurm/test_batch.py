"""deploy/slurm/sglang-supervisor.sbatch on the two-node test cluster: the daemon runs as
the batch step and owns a two-node server step; SIGKILLed, it is restarted by the batch
script and the new daemon adopts the running step (same launch, no restart of the
server); ``scancel --batch -s TERM`` stops it gracefully (exit 0, nothing left on any
node, the job ends)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import psutil
import pytest

from tests.helpers import tagged_processes, wait_until
from tests.slurm.test_slurm_daemon import slurm_daemon, step_names
from tests.slurmkit import SlurmCluster

pytestmark = pytest.mark.slurm
ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "deploy" / "slurm" / "sglang-supervisor.sbatch"


def daemon_pids(config: Path) -> list[int]:
    """Our daemon's process: ``serve --config <this test's config>``."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "serve" in cmd and str(config) in cmd:
            out.append(p.pid)
    return out


def test_batch_script_restarts_the_daemon_which_adopts_the_step(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    d = slurm_daemon(slurm_cluster, "unused", tmp_path, {"tp_size": 4, "nnodes": 2})
    batch_log = tmp_path / "batch.log"
    got = slurm_cluster.run(
        ["sbatch", "-N2", "-o", str(batch_log), str(SBATCH)],
        SGLANG_SUPERVISOR_CONFIG=str(d.config_path),
        SGLANG_SUPERVISOR_BIN=str(
            Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "sglang-supervisor"
        ),
        SGLANG_SUPERVISOR_RESTART_DELAY_S="0.2",
    )
    found = re.search(r"Submitted batch job (\d+)", got.stdout)
    assert found, got.stderr
    job = found.group(1)
    try:
        first = wait_until(lambda: daemon_pids(d.config_path), 60, 0.1, "the daemon started")
        s = d.wait_state("ready", 60)
        tag, server_pid = s["server"]["launch_tag"], s["server"]["pid"]
        assert step_names(slurm_cluster, job) == [tag]

        psutil.Process(first[0]).kill()
        again = wait_until(
            lambda: [p for p in daemon_pids(d.config_path) if p not in first],
            60,
            0.1,
            "the daemon restarted by the batch script",
        )
        assert again
        s = d.wait_state("ready", 60)
        # Adopted: the same step and the same srun, never restarted.
        assert (s["server"]["launch_tag"], s["server"]["pid"]) == (tag, server_pid)
        assert "adopting pid" in batch_log.read_text()

        stopped = slurm_cluster.run(["scancel", "--batch", "-s", "TERM", job])
        assert stopped.returncode == 0, stopped.stderr
        wait_until(
            lambda: slurm_cluster.run(["squeue", "-h", "-j", job]).stdout.strip() == "",
            60,
            0.2,
            "the job ended",
        )
        assert "sglang-supervisor exited with status 0" in batch_log.read_text()
        assert tagged_processes(d.instance) == []
    finally:
        slurm_cluster.run(["scancel", "-s", "KILL", job])
        d.client.close()
