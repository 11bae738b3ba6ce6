"""One server step in hand: ``SlurmStep`` (the local ``srun`` of the step, with its
nodes), the step's ids as Slurm lists them (``squeue -s``, which creates no step), its
``scancel -s KILL``, and what srun says when Slurm refuses to create a step at all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sglang_supervisor.host import process
from sglang_supervisor.slurm.settings import SlurmSettings

log = logging.getLogger("supervisor")

#: srun's words when Slurm will not create (or keep) a step: the job's step limit
#: (``MaxStepCount``), a job that ended, a controller that does not answer.
_REFUSED = re.compile(
    r"srun: error: (Unable to create step|.*(Step limit|has expired|already completing|"
    r"Invalid job id|Unable to contact slurm controller|step creation.*disabled)).*",
    re.IGNORECASE,
)


#: Refusals that last for the job's life: its step limit reached, the job itself gone.
_FOR_GOOD = re.compile(
    r"Step limit|has expired|already completing|Invalid job id|Job not found", re.IGNORECASE
)


def refused_for_good(words: str | None) -> bool:
    """Whether srun's refusal ``words`` last as long as the job (the others, a controller
    that does not answer, may pass)."""
    return words is not None and _FOR_GOOD.search(words) is not None


@dataclass
class SlurmStep(process.Launch):
    """The local ``srun`` of one server step, with the nodes it runs on."""

    job_id: str = ""
    nodes: tuple[str, ...] = ()


def slurm_refusal(lines: Sequence[str]) -> str | None:
    """srun's line saying Slurm refused the step, if ``lines`` (its output) hold one."""
    for line in reversed(lines):
        found = _REFUSED.search(line)
        if found is not None:
            return found.group(0).strip()
    return None


def srun_said(lines: Sequence[str]) -> str:
    """What srun said when it could not make (or keep) a step: its error lines."""
    errors = [ln.strip() for ln in lines if "error" in ln.lower()]
    return "; ".join(errors[-3:]) or "; ".join(ln.strip() for ln in lines[-3:]) or "no output"


def log_tail(path: Path, limit: int = 8192) -> list[str]:
    """The last lines of a launch's log (srun writes its errors there). Blocking."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode(errors="replace").splitlines()
    except OSError:
        return []


def squeue_of(slurm: SlurmSettings) -> str:
    """``squeue`` beside the configured ``scancel``."""
    return str(Path(slurm.scancel).with_name("squeue")) if "/" in slurm.scancel else "squeue"


def step_ids(slurm: SlurmSettings, job_id: str, name: str) -> list[str]:
    """``job.step`` ids of the running steps of ``job_id`` named ``name``."""
    done = subprocess.run(
        [squeue_of(slurm), "-h", "-s", "-j", job_id, "-o", "%i %j"],
        capture_output=True,
        text=True,
        timeout=slurm.probe_timeout_s,
        check=False,
    )
    out = []
    for line in done.stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].strip() == name:
            out.append(parts[0])
    return out


def scancel_kill(slurm: SlurmSettings, step: SlurmStep) -> None:
    """``scancel -s KILL`` of the step named by the launch tag (every node's tasks). When
    Slurm does not answer in ``probe_timeout_s`` (a controller slow or down), our srun is
    SIGKILLed instead: Slurm ends its step, and the stop goes on to its sweep."""
    try:
        ids = step_ids(slurm, step.job_id, step.tag)
        for step_id in ids:
            subprocess.run(
                [slurm.scancel, "-s", "KILL", step_id],
                capture_output=True,
                timeout=slurm.probe_timeout_s,
                check=False,
            )
    except (subprocess.TimeoutExpired, OSError) as exc:
        log.warning(
            "scancel of step %s (job %s, srun pid %s) failed: %s; SIGKILL to the srun instead",
            step.tag,
            step.job_id,
            step.pid,
            exc,
        )
        ids = []
    if not ids:  # the step is not listed (yet), or Slurm did not answer: kill our srun
        with contextlib.suppress(ProcessLookupError):
            os.kill(step.pid, signal.SIGKILL)
