"""The Slurm allocation the daemon runs in: job id, nodes in order, a node's address.

Read from the environment Slurm gives a batch step (``SLURM_JOB_ID``,
``SLURM_JOB_NODELIST``, ``SLURM_JOB_NUM_NODES``) and from ``scontrol``. Without an
allocation the slurm launcher cannot launch anything: ``require_allocation`` refuses the
daemon's start with what to do.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang_supervisor.slurm.settings import SlurmSettings


class NotInAllocation(RuntimeError):
    """The daemon is not inside a Slurm allocation (or Slurm does not answer about it)."""


@dataclass(frozen=True)
class Allocation:
    job_id: str
    #: Node names in the allocation's order: the first is node 0 of every step we launch.
    nodes: tuple[str, ...]


def allocation_nodes(env: Mapping[str, str] | None = None) -> int | None:
    """How many nodes the allocation has, from Slurm's environment (None: not in one)."""
    env = os.environ if env is None else env
    for key in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        text = env.get(key, "")
        if text.isdigit():
            return int(text)
    return None


def _run(argv: list[str], timeout: float) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NotInAllocation(f"cannot run {argv[0]!r}: {exc}") from exc
    if done.returncode != 0:
        raise NotInAllocation(
            f"{' '.join(argv)} failed (exit {done.returncode}): {done.stderr.strip()[:300]}"
        )
    return done.stdout


def require_allocation(
    scontrol: str = "scontrol", env: Mapping[str, str] | None = None, timeout: float = 30.0
) -> Allocation:
    """The allocation this process runs in; raises ``NotInAllocation`` saying what to do."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID", "")
    if not job:
        raise NotInAllocation(
            'server.launcher is "slurm" but the daemon is not inside a Slurm allocation '
            "(SLURM_JOB_ID is unset): start it as the batch step of an allocation, e.g. "
            "`sbatch -N2 deploy/slurm/sglang-supervisor.sbatch` (docs/slurm.md), or set "
            'server.launcher = "local"'
        )
    # Slurm's own record of the job: inside a job step (a replica's daemon run with srun)
    # SLURM_JOB_NODELIST may be the step's nodes, not the allocation's.
    out = _run([scontrol, "show", "job", job], timeout)
    found = re.search(r"\bNodeList=(\S+)", out)
    if found is None:
        raise NotInAllocation(f"scontrol show job {job} names no NodeList: {out[:300]}")
    nodelist = found.group(1)
    names = tuple(_run([scontrol, "show", "hostnames", nodelist], timeout).split())
    if not names:
        raise NotInAllocation(f"allocation {job}: no node in its node list {nodelist!r}")
    return Allocation(job, names)


def node_address(name: str, scontrol: str = "scontrol", timeout: float = 30.0) -> str:
    """The address Slurm reaches node ``name`` at (its ``NodeAddr``)."""
    out = _run([scontrol, "show", "node", name], timeout)
    found = re.search(r"\bNodeAddr=(\S+)", out)
    return found.group(1) if found else name


def share_of(allocation: Allocation, slurm: SlurmSettings) -> Allocation:
    """This daemon's share of ``allocation`` (``slurm.first_node``, ``slurm.node_count``:
    replicas in one allocation); raises ``NotInAllocation`` when it has no node there."""
    start = slurm.first_node
    end = start + slurm.node_count if slurm.node_count else len(allocation.nodes)
    nodes = allocation.nodes[start:end]
    if not nodes or end > len(allocation.nodes):
        raise NotInAllocation(
            f"slurm.first_node {start}, slurm.node_count {slurm.node_count}: the allocation "
            f"(job {allocation.job_id}) has {len(allocation.nodes)} nodes "
            f"({', '.join(allocation.nodes)}); give each replica's daemon nodes within it"
        )
    return Allocation(allocation.job_id, nodes)
