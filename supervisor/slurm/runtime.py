"""Wiring the slurm launcher: the allocation, the per-node presence, the merged GPU probe."""

from __future__ import annotations

from pathlib import Path

from sglang_supervisor.config import Settings, instance_tag_prefix
from sglang_supervisor.host.backend import Backend
from sglang_supervisor.slurm.allocation import require_allocation, share_of
from sglang_supervisor.slurm.launcher import SlurmProcessOps
from sglang_supervisor.slurm.presence import Presence
from sglang_supervisor.slurm.probe import SlurmGpuProbe


def slurm_backend(
    settings: Settings, backend: Backend, cwd: Path | None
) -> tuple[Backend, SlurmProcessOps]:
    """``backend`` with its GPU probe replaced by every node's (the simulated GPUs of each
    node under ``<registry>/<node>``), and the ``ProcessOps`` launching one job step.

    Raises ``NotInAllocation`` outside a Slurm allocation."""
    allocation = share_of(require_allocation(settings.slurm.scontrol), settings.slurm)
    probe_args: tuple[str, ...] = ()
    if backend.name == "simulated":
        sim = settings.sim
        backend.env["SGLANG_SIM_GPU_DIR_PER_NODE"] = "1"
        probe_args = (
            "--sim-registry",
            backend.env["SGLANG_SIM_GPU_DIR"],
            "--sim-gpus",
            str(sim.gpus),
            "--sim-mib",
            str(sim.gpu_memory_mib),
            "--sim-baseline-mib",
            str(sim.baseline_mib),
        )
    presence = Presence(
        settings.slurm,
        allocation.job_id,
        allocation.nodes,
        probe_args,
        tag_prefix=instance_tag_prefix(settings),
    )
    probe = SlurmGpuProbe(presence, backend.probe.kind)
    backend.probe = probe
    procs = SlurmProcessOps(settings.slurm, allocation, presence, cwd=cwd, probe=probe)
    return backend, procs
