"""A real daemon and a real FIFO (issue 27 §2): a SIGHUP while the config is a FIFO froze
the event loop — /healthz and /status stopped answering, the server went unwatched,
SIGTERM was not acted on — until a writer appeared; a FIFO config at start-up hung the
same way. Now the FIFO is refused at once, and every refusal (bad TOML too) shows in
/status until a reload loads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import Daemon, free_port, wait_until


def reload_warnings(d: Daemon) -> list[str]:
    # A short timeout: a daemon whose loop hangs in a read must fail here, not wait.
    r = d.client.get("/status", timeout=5)
    r.raise_for_status()
    return [w for w in r.json()["warnings"] if w.startswith("reload (SIGHUP)")]


def sighup_until(d: Daemon, what: str, shown: str | None) -> list[str]:
    assert d.proc is not None
    d.proc.send_signal(signal.SIGHUP)

    def seen() -> tuple[list[str]] | None:
        # The log first: /status asked after it already knows what that reload showed.
        loaded = "reload (SIGHUP): nothing to change" in d.log()  # the first that loads
        warnings = reload_warnings(d)
        if shown is None:
            return (warnings,) if loaded else None
        return (warnings,) if any(shown in w for w in warnings) else None

    return wait_until(seen, 15, 0.05, what)[0]


def test_a_fifo_or_bad_toml_config_is_refused_and_shown_the_daemon_answering(
    daemon_factory: type[Daemon],
) -> None:
    d = daemon_factory(gpus=2).start()
    pid = d.status()["server"]["pid"]
    good = d.config_path.read_text()
    d.config_path.unlink()
    os.mkfifo(d.config_path)  # no writer, ever
    (shown,) = sighup_until(d, "the FIFO refused in /status", "is a FIFO")
    assert f"config {d.config_path} is a FIFO (named pipe), not a regular file" in shown, shown
    assert "the daemon keeps the settings it had" in shown
    assert d.client.get("/healthz", timeout=5).json()["ok"] is True
    d.config_path.unlink()
    d.config_path.write_text(good.replace("[server]", "[server"))
    (shown,) = sighup_until(d, "the bad TOML in /status", "is not valid TOML")
    assert "FIFO" not in shown  # the earlier refusal is replaced, not kept beside it
    d.config_path.write_text(good)
    assert sighup_until(d, "the refusal gone once the config loads", None) == []
    st = d.status()
    assert st["state"] == "ready" and st["server"]["pid"] == pid  # the server untouched
    assert d.stop(timeout=30) == 0


def test_a_fifo_config_at_start_up_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sglang_supervisor_api.cli",
            "serve",
            "--simulate",
            "--config",
            str(fifo),
            "--state-dir",
            str(tmp_path / "s"),
            "--port",
            str(free_port()),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, stderr = proc.communicate(timeout=60)  # it hung here until a writer came
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, stderr
    assert f"config {fifo} is a FIFO (named pipe), not a regular file" in stderr, stderr
