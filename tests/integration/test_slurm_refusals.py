"""The slurm launcher's refusals through the real daemon, without a cluster: the daemon
refuses to start outside an allocation, and the local launcher refuses a server that
spans hosts with a 422 naming nnodes (nothing touched)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import Daemon, write_toml


def test_slurm_launcher_outside_an_allocation_refuses_to_start(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    write_toml(
        config,
        {
            "simulate": True,
            "state_dir": str(tmp_path / "state"),
            "api": {"port": 0},
            "server": {"launcher": "slurm"},
        },
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run(
        [sys.executable, "-m", "sglang_supervisor_api.cli", "serve", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "not inside a Slurm allocation (SLURM_JOB_ID is unset)" in done.stderr
    assert "sbatch" in done.stderr


def test_local_launcher_refuses_two_nodes(readonly_daemon: Daemon) -> None:
    pid = readonly_daemon.status()["server"]["pid"]
    r = readonly_daemon.apply({"nnodes": 2, "tp_size": 8}, dry_run=True)
    assert r.status_code == 422, r.text
    problems = r.json()["detail"]["problems"]
    assert [p["lever"] for p in problems] == ["nnodes"], problems
    assert (
        'server.launcher = \\"slurm\\"' in r.text
        or 'server.launcher = "slurm"' in problems[0]["message"]
    )
    assert readonly_daemon.status()["server"]["pid"] == pid
