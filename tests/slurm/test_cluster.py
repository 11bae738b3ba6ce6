"""The two-node Slurm test cluster itself (scripts/slurm-cluster.sh): what the multi-host
tests rely on — one task per node, each told its node id and node name — and that the
script's own start/stop leaves nothing running."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psutil
import pytest

from tests.helpers import wait_until
from tests.slurmkit import SlurmCluster

pytestmark = pytest.mark.slurm
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "slurm-cluster.sh"


def test_one_task_per_node_knows_its_node(slurm_cluster: SlurmCluster) -> None:
    got = slurm_cluster.run(
        ["srun", "-N2", "--ntasks-per-node=1", "bash", "-c", "echo $SLURM_NODEID $SLURMD_NODENAME"]
    )
    assert got.returncode == 0, got.stderr
    assert sorted(got.stdout.split("\n")[:2]) == ["0 n1", "1 n2"]


def test_script_starts_a_second_cluster_beside_and_stops_it(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """A second cluster on free ports runs beside the suite's; stop ends its daemons."""
    slurm_dir = tmp_path / "cluster"
    started = subprocess.run(
        ["bash", str(SCRIPT), "start", str(slurm_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    try:
        assert started.returncode == 0, started.stderr
        conf = slurm_dir / "etc" / "slurm.conf"
        assert started.stdout.strip() == f"export SLURM_CONF={conf}"
        pids = [
            int((slurm_dir / "run" / n).read_text())
            for n in ("slurmctld.pid", "slurmd-n1.pid", "slurmd-n2.pid")
        ]
        assert all(psutil.pid_exists(p) for p in pids)
        ours = SlurmCluster(conf)
        got = ours.run(
            ["srun", "-N2", "--ntasks-per-node=1", "bash", "-c", "echo $SLURMD_NODENAME"]
        )
        assert sorted(got.stdout.split()) == ["n1", "n2"], got.stderr
    finally:
        stopped = subprocess.run(
            ["bash", str(SCRIPT), "stop", str(slurm_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert stopped.returncode == 0, stopped.stderr
    wait_until(lambda: not any(psutil.pid_exists(p) for p in pids), 10, what="daemons gone")
