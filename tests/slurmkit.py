"""The two-node Slurm test cluster (``scripts/slurm-cluster.sh``): finding it, allocating
nodes in it, running Slurm's commands against it.

``scripts/test.sh`` starts the cluster and exports ``SGLANG_SUPERVISOR_TEST_SLURM_CONF``;
a developer starts one with ``scripts/slurm-cluster.sh start /tmp/x`` and exports the same
variable. Without it the tests that need the cluster skip, and fail under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

SLURM_CONF_ENV = "SGLANG_SUPERVISOR_TEST_SLURM_CONF"


@dataclass(frozen=True)
class SlurmCluster:
    """A running test cluster, named by its slurm.conf."""

    conf: Path

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment pointed at the cluster, less any allocation of ours."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        return {**base, "SLURM_CONF": str(self.conf), **extra}

    def run(
        self, argv: Sequence[str], timeout: float = 30, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    @contextlib.contextmanager
    def allocation(self, nodes: int = 2) -> Iterator[str]:
        """``salloc -N<nodes> --no-shell``: the job id of a fresh allocation, cancelled
        (every step killed) afterwards."""
        got = self.run(["salloc", f"-N{nodes}", "--no-shell", "--immediate=20"], timeout=40)
        found = re.search(r"Granted job allocation (\d+)", got.stderr + got.stdout)
        assert found, f"salloc failed: {got.stderr or got.stdout}"
        job = found.group(1)
        try:
            yield job
        finally:
            self.run(["scancel", "-s", "KILL", job])
            self.run(["scancel", job])

    def step_id(self, job: str) -> int:
        """The step id Slurm gives a new step of ``job`` now (by making one: a marker).
        Slurm numbers a job's steps 0, 1, 2...: between two markers ``a`` and ``b``,
        ``b - a - 1`` steps were made, whoever made them."""
        got = self.run(
            ["srun", "--overlap", f"--jobid={job}", "-N1", "-n1", "sh", "-c", "echo $SLURM_STEP_ID"]
        )
        assert got.returncode == 0, got.stderr
        return int(got.stdout.split()[-1])

    def steps(self, job: str) -> list[str]:
        """The running steps of ``job`` as ``job.step`` ids (batch/extern steps left out)."""
        out = self.run(["squeue", "-h", "-s", "-j", job, "-o", "%i"]).stdout.split()
        return [s for s in out if re.fullmatch(r"\d+\.\d+", s)]


def find_cluster() -> SlurmCluster:
    """The test cluster, or a skip (a failure under ``CI=true``) saying how to get one."""
    conf = os.environ.get(SLURM_CONF_ENV)
    if conf and Path(conf).is_file():
        return SlurmCluster(Path(conf))
    why = (
        f"needs the two-node Slurm test cluster: ${SLURM_CONF_ENV} "
        f"({conf or 'unset'}) names no slurm.conf; scripts/test.sh starts one, or run "
        "`scripts/slurm-cluster.sh start DIR` and export the SLURM_CONF it prints under "
        f"{SLURM_CONF_ENV}"
    )
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI: " + why)
    pytest.skip(why)


def node_processes(prefix: str, node: str) -> list[psutil.Process]:
    """Processes on the test cluster's ``node`` (``SLURMD_NODENAME``) whose launch tag
    starts with ``prefix``: the nodes share this host, their processes do not."""
    from tests.helpers import tagged_processes

    out = []
    for p in tagged_processes(prefix):
        try:
            if p.environ().get("SLURMD_NODENAME") == node:
                out.append(p)
        except psutil.Error:
            continue
    return out


def presence_task(instance: str, node: str) -> psutil.Process:
    """The per-node presence's task of daemon ``instance`` on ``node``."""
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        try:
            if (
                "sglang_supervisor.slurm.agent" in cmd
                and f"{instance}." in cmd
                and p.environ().get("SLURMD_NODENAME") == node
            ):
                return p
        except psutil.Error:
            continue
    raise AssertionError(f"no presence task of {instance} on {node}")
