"""``sglang-supervisor cleanup`` (systemd's ExecStopPost): never under a running daemon,
and found by ``--state-dir`` like ``serve``."""

from __future__ import annotations

import os
import subprocess
import sys

from sglang_supervisor.config import instance_name, load_settings
from tests.helpers import Daemon, register_tag, tagged_processes


def cleanup(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SERVICE_RESULT"}
    return subprocess.run(
        [sys.executable, "-m", "sglang_supervisor_api.cli", "cleanup", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_cleanup_refuses_while_the_daemon_runs(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory(gpus=2).start()
    pid = d.status()["server"]["pid"]
    out = cleanup("--config", str(d.config_path))
    assert out.returncode == 2, out.stdout + out.stderr
    assert d.proc is not None and f"the daemon (pid {d.proc.pid}) still runs" in out.stderr
    # The server is the daemon's: untouched.
    assert d.status()["server"]["pid"] == pid
    assert any(p.pid == pid for p in tagged_processes(d.instance))


def test_cleanup_takes_the_state_dir_like_serve(daemon_factory: type[Daemon]) -> None:
    # No instance in the config: the daemon derives it from its state dir, so cleanup
    # finds the server from --state-dir alone.
    d = daemon_factory(gpus=2)
    config = "\n".join(
        line for line in d.config_path.read_text().splitlines() if not line.startswith("instance")
    )
    d.config_path.write_text(config + "\n")
    derived = instance_name(load_settings(d.config_path, {}))
    d.instance = register_tag(derived)
    d.env["SGLANG_SUPERVISOR_KEEP_SERVER"] = "1"
    d.start()
    assert d.stop() == 0
    assert tagged_processes(derived), "keep mode left no server"
    out = cleanup("--state-dir", str(d.dir / "state"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"cleanup of instance {derived!r}" in out.stdout
    assert "member processes exited" in out.stdout
    assert tagged_processes(derived) == []
