"""The console script refuses an environment shared with Supervisord, naming it."""

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
        [sys.executable, "-m", "api.entry", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )


def test_supervisord_in_the_same_environment_is_refused(tmp_path: Path) -> None:
    dist = tmp_path / "supervisor-4.2.5.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: supervisor\nVersion: 4.2.5\n")
    r = run(tmp_path, "serve", "--simulate")
    assert r.returncode == 2, r
    assert "Supervisord" in r.stderr and "4.2.5" in r.stderr
    assert "dedicated environment" in r.stderr


def test_without_supervisord_the_cli_runs() -> None:
    r = run(None, "--help")
    assert r.returncode == 0, r.stderr
    assert "serve" in r.stdout
