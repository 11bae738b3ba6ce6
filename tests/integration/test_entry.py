"""The console script: it runs, and an unusable state dir is one line and an exit status
systemd does not restart on. (Beside Supervisord: test_beside_supervisord.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(extra_path: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(extra_path), str(ROOT)])
    return subprocess.run(
        [sys.executable, "-m", "sglang_supervisor_api.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )


def test_the_cli_runs() -> None:
    r = run(None, "--help")
    assert r.returncode == 0, r.stderr
    assert "serve" in r.stdout


def test_an_unwritable_state_dir_is_one_line_and_an_exit_status_systemd_does_not_restart_on(
    tmp_path: Path,
) -> None:
    """Issue 20 §4: a state dir the daemon cannot write gave a traceback and exit 1, so
    systemd (Restart=on-failure) restart-looped. Now: one line naming the directory, and
    exit 3, which the unit lists in RestartPreventExitStatus."""
    state_dir = "/sys/kernel/sglang-supervisor-state"  # sysfs: no directory can be made
    r = run(None, "serve", "--simulate", "--port", "0", "--state-dir", state_dir)
    assert r.returncode == 3, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"cannot write the state directory {state_dir}" in lines[0]
    unit = (ROOT / "systemd" / "sglang-supervisor.service").read_text()
    prevent = [ln for ln in unit.splitlines() if ln.startswith("RestartPreventExitStatus=")]
    assert prevent and "3" in prevent[0].split("=", 1)[1].split(), prevent
