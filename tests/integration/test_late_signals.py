"""Issue 20 §7: a late signal never changes how the daemon ends.

A SIGTERM in the daemon's last instants exited -15 after a clean stop (CPython's
finalization puts Python-level handlers back to the default action); a SIGHUP in its
first ~50 ms killed it (handlers were installed after ``importlib.metadata`` was imported
and searched)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import Daemon, tagged_processes, wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_sigterms_until_the_very_end_still_exit_0(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory(gpus=2).start()
    proc = d.proc
    assert proc is not None
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    sent = 1
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)  # a SIGTERM every 2 ms, through the process's finalization
        try:
            proc.send_signal(signal.SIGTERM)
            sent += 1
        except ProcessLookupError:
            break
    code = proc.wait(10)
    assert code == 0, f"exit {code} after {sent} SIGTERMs:\n{d.log()}"
    assert tagged_processes(d.instance) == []


def test_the_signal_handlers_come_before_any_other_import(tmp_path: Path) -> None:
    """The console script installs them before ``importlib.metadata`` is even imported: the window
    in which a SIGHUP kills the daemon is the interpreter's own start-up only."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "sglang_supervisor_api.cli",
            "serve",
            "--simulate",
            "--port",
            "0",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def caught() -> bool:
        status = Path(f"/proc/{proc.pid}/status").read_text()
        line = next(ln for ln in status.splitlines() if ln.startswith("SigCgt:"))
        return bool(int(line.split()[1], 16) >> (signal.SIGHUP - 1) & 1)

    wait_until(caught, 30, 0.001, "the SIGHUP handler")
    proc.send_signal(signal.SIGHUP)  # recorded, then a reload: never the default action
    time.sleep(0.2)
    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    imports = [ln.rsplit("|", 1)[-1].strip() for ln in err.splitlines() if "import time:" in ln]
    assert "sglang_supervisor_api.daemon_signals" in imports, err[-3000:]
    assert "importlib.metadata" in imports
    assert imports.index("sglang_supervisor_api.daemon_signals") < imports.index(
        "importlib.metadata"
    )
