"""A stop whose ``scancel`` (or ``squeue``) Slurm does not answer in time still ends the
step: our srun is SIGKILLed (Slurm ends its step) and the stop goes on, instead of the
daemon's shutdown dying of a ``TimeoutExpired`` (seen on a loaded two-node cluster)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sglang_supervisor.slurm.settings import SlurmSettings
from sglang_supervisor.slurm.step import SlurmStep, scancel_kill
from tests.helpers import wait_until


def test_a_slurm_that_does_not_answer_ends_in_a_sigkill_of_our_srun(tmp_path: Path) -> None:
    for name in ("squeue", "scancel"):  # both hang past the timeout
        tool = tmp_path / name
        tool.write_text("#!/bin/sh\nexec sleep 30\n")
        tool.chmod(0o755)
    srun = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        settings = SlurmSettings(scancel=str(tmp_path / "scancel"), probe_timeout_s=0.5)
        step = SlurmStep(pid=srun.pid, create_time=0.0, tag="t.x", log_path=tmp_path / "log")
        step.job_id = "7"
        scancel_kill(settings, step)  # does not raise
        wait_until(lambda: srun.poll() is not None, 10, 0.05, "our srun killed")
        assert srun.returncode == -9
    finally:
        if srun.poll() is None:
            srun.kill()
        srun.wait()
