"""deploy/slurm/sglang-supervisor.sbatch on the two-node test cluster: the daemon runs as
the batch step and owns a two-node server step; SIGKILLed, it is restarted by the batch
script and the new daemon adopts the running step (same launch, no restart of the
server); ``scancel --batch -s TERM`` stops it gracefully (exit 0, nothing left on any
node, the job ends); a plain ``scancel`` of the job, which signals the script and the
daemon at once, is one graceful stop, never a forced one; a daemon that exits 4 (the
allocation cannot host the server) has its job requeued."""

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


BIN = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "sglang-supervisor"


def submit(cluster: SlurmCluster, config: Path, batch_log: Path, **env: str) -> str:
    """``sbatch -N2`` of the shipped script for the daemon of ``config``: the job id."""
    got = cluster.run(
        ["sbatch", "-N2", "-o", str(batch_log), str(SBATCH)],
        SGLANG_SUPERVISOR_CONFIG=str(config),
        SGLANG_SUPERVISOR_BIN=str(BIN),
        SGLANG_SUPERVISOR_RESTART_DELAY_S="0.2",
        **env,
    )
    found = re.search(r"Submitted batch job (\d+)", got.stdout)
    assert found, got.stderr
    return found.group(1)


def test_batch_script_restarts_the_daemon_which_adopts_the_step(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    d = slurm_daemon(slurm_cluster, "unused", tmp_path, {"tp_size": 4, "nnodes": 2})
    batch_log = tmp_path / "batch.log"
    job = submit(slurm_cluster, d.config_path, batch_log)
    try:
        first = wait_until(lambda: daemon_pids(d.config_path), 60, 0.1, "the daemon started")
        s = d.wait_state("ready", 60)
        # A rank SIGKILLed on the second node first: one restart, which the next daemon
        # keeps counting (its crash-loop window too).
        old_tag = s["server"]["launch_tag"]
        psutil.Process(s["gpus"][2]["processes"][0]["pid"]).kill()
        s = wait_until(
            lambda: (
                (s := d.status_or_none())
                and s["state"] == "ready"
                and s["operation"] is None
                and s["server"]["launch_tag"] != old_tag
                and s
            ),
            60,
            0.1,
            "the group recovered",
        )
        assert s["restarts"] == 1
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
        # Adopted: the same step and the same srun, never restarted; its restart counted.
        assert (s["server"]["launch_tag"], s["server"]["pid"]) == (tag, server_pid)
        assert s["restarts"] == 1 and s["restarts_by_reason"] == {"crash": 1}
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


def test_scancel_of_the_job_is_one_graceful_stop(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Slurm signals the batch script and the daemon together; the script passes its
    signal on (as SIGUSR1): the daemon stops once, gracefully (it was forced before:
    'SIGTERM again: forcing the stop')."""
    d = slurm_daemon(slurm_cluster, "unused", tmp_path, {"tp_size": 4, "nnodes": 2})
    batch_log = tmp_path / "batch.log"
    job = submit(slurm_cluster, d.config_path, batch_log)
    try:
        d.wait_state("ready", 90)
        got = slurm_cluster.run(["scancel", job])
        assert got.returncode == 0, got.stderr
        wait_until(
            lambda: slurm_cluster.run(["squeue", "-h", "-j", job]).stdout.strip() == "",
            60,
            0.2,
            "the job ended",
        )
        text = batch_log.read_text()
        assert "stopping: the server is stopped and its GPUs verified released" in text, text
        assert "forcing the stop" not in text, text
        assert "already stopping" in text  # the twin signal, seen and taken as the same stop
    finally:
        slurm_cluster.run(["scancel", "-s", "KILL", job])
        d.client.close()


def test_a_daemon_exiting_4_has_its_job_requeued(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Exit 4: Slurm refuses this job's steps (its MaxStepCount, tests/slurm/test_step_limit.py):
    the script asks for a fresh allocation by requeueing the job (bounded by
    SGLANG_SUPERVISOR_MAX_REQUEUES). A stand-in daemon that exits 4 at once."""
    fake = tmp_path / "daemon-exit-4"
    fake.write_text("#!/bin/sh\necho 'stand-in daemon: exit 4' >&2\nexit 4\n")
    fake.chmod(0o755)
    batch_log = tmp_path / "batch.log"
    got = slurm_cluster.run(
        ["sbatch", "-N1", "-o", str(batch_log), "--open-mode=append", str(SBATCH)],
        SGLANG_SUPERVISOR_BIN=str(fake),
        SGLANG_SUPERVISOR_CONFIG=str(tmp_path / "unused.toml"),
    )
    found = re.search(r"Submitted batch job (\d+)", got.stdout)
    assert found, got.stderr
    job = found.group(1)
    try:
        # Requeued: pending again, once (Slurm holds a requeued job for a while).
        shown = wait_until(
            lambda: (
                "Restarts=1" in (out := slurm_cluster.run(["scontrol", "show", "job", job]).stdout)
                and out
            ),
            60,
            0.2,
            "the job requeued",
        )
        assert "JobState=PENDING" in shown, shown
        assert "requeueing job" in batch_log.read_text()
    finally:
        slurm_cluster.run(["scancel", job])
