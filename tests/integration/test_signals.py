"""The daemon's signals, end to end: SIGTERM honoured from the first instant (while
importing, while starting), open event streams closed on shutdown, SIGHUP reloading the
token and timeouts without touching the server."""

from __future__ import annotations

import signal
import stat
import subprocess
import threading
from pathlib import Path

import httpx
import psutil

from tests.helpers import Daemon, tagged_processes, wait_until

UNIT = Path(__file__).parents[2] / "systemd" / "sglang-supervisor.service"


def catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` has a handler installed for ``sig`` (/proc's SigCgt)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def slow_sglang_python(tmp: Path, seconds: int = 20) -> str:
    """An interpreter path whose every run takes ``seconds``: the daemon's start-up
    (asking it for SGLang's version) then lasts that long."""
    script = tmp / "slow-python"
    script.write_text(f"#!/bin/sh\nexec sleep {seconds}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def starting_up(d: Daemon) -> bool:
    """The daemon is inside its start-up: it asks the (slow) interpreter for SGLang."""
    assert d.proc is not None
    try:
        children = psutil.Process(d.proc.pid).children(recursive=True)
        return any("sleep" in " ".join(c.cmdline()) for c in children)
    except psutil.Error:
        return False


def exit_code(d: Daemon, timeout: float = 30) -> int:
    assert d.proc is not None
    try:
        return d.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        d.proc.kill()
        d.proc.wait(5)
        raise AssertionError(f"the daemon did not exit within {timeout}s:\n{d.log()}") from None


def test_sigterm_as_soon_as_the_handlers_exist_stops_the_daemon(
    daemon_factory: type[Daemon],
) -> None:
    d = daemon_factory(gpus=2)
    proc = d.spawn()
    # The earliest moment a handler can exist: still importing.
    wait_until(lambda: catches(proc.pid, signal.SIGTERM), 30, 0.001, "a SIGTERM handler")
    proc.send_signal(signal.SIGTERM)
    assert exit_code(d) == 0, d.log()
    assert tagged_processes(d.instance) == []


def test_sigterm_during_a_slow_start_up_is_honoured(
    daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    d = daemon_factory(gpus=2, extra={"server": {"python": slow_sglang_python(tmp_path)}})
    proc = d.spawn()
    wait_until(lambda: starting_up(d), 30, 0.02, "the start-up asking for SGLang")
    proc.send_signal(signal.SIGTERM)
    assert exit_code(d, 15) == 0, d.log()
    assert tagged_processes(d.instance) == []


def test_sigterm_during_start_up_stops_the_server_it_would_have_adopted(
    daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    d = daemon_factory(gpus=2)
    d.env["SGLANG_SUPERVISOR_KEEP_SERVER"] = "1"
    d.start()
    assert d.stop() == 0
    kept = tagged_processes(d.instance)
    assert kept, "keep mode left no server to adopt"
    # The next daemon (keep mode off) is stopped while it is still starting up.
    d.env["SGLANG_SUPERVISOR_KEEP_SERVER"] = "0"
    d.config_path.write_text(
        d.config_path.read_text().replace(
            "[server]\n", f'[server]\npython = "{slow_sglang_python(tmp_path)}"\n', 1
        )
    )
    proc = d.spawn()
    wait_until(lambda: starting_up(d), 30, 0.02, "the start-up asking for SGLang")
    proc.send_signal(signal.SIGTERM)
    assert exit_code(d) == 0, d.log()
    assert tagged_processes(d.instance) == [], d.log()


def test_open_event_streams_end_when_the_daemon_stops(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory(gpus=2).start()
    ended: list[str] = []
    opened = threading.Event()

    def listen() -> None:
        try:
            with httpx.stream("GET", f"{d.url}/events", timeout=60, trust_env=False) as r:
                for _ in r.iter_lines():
                    opened.set()
            ended.append("closed by the daemon")
        except httpx.HTTPError as exc:
            ended.append(f"broken: {exc!r}")

    reader = threading.Thread(target=listen, daemon=True)
    reader.start()
    assert opened.wait(10)
    assert d.stop() == 0
    reader.join(10)
    assert ended == ["closed by the daemon"]
    log = d.log()
    assert "Traceback" not in log and "timeout graceful shutdown exceeded" not in log, log


def test_sighup_reloads_the_token_and_timeouts_and_keeps_the_server(
    daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("old-token\n")
    token.chmod(0o600)
    d = daemon_factory(gpus=2, extra={"api": {"token_file": str(token)}})
    d.client.headers["Authorization"] = "Bearer old-token"
    d.start()
    pid = d.status()["server"]["pid"]
    assert d.proc is not None

    token.write_text("new-token\n")
    d.config_path.write_text(
        d.config_path.read_text().replace("stop_grace_s = 2.0", "stop_grace_s = 3.5")
    )
    d.proc.send_signal(signal.SIGHUP)

    def new_token_works() -> bool:
        r = httpx.get(
            f"{d.url}/status", headers={"Authorization": "Bearer new-token"}, trust_env=False
        )
        return r.status_code == 200

    wait_until(new_token_works, 10, 0.05, "the new token accepted")
    d.client.headers["Authorization"] = "Bearer new-token"
    old = httpx.get(
        f"{d.url}/status", headers={"Authorization": "Bearer old-token"}, trust_env=False
    )
    assert old.status_code == 401
    assert d.proc.poll() is None
    assert d.status()["server"]["pid"] == pid
    assert "stop_grace_s 2.0 -> 3.5" in d.log()

    # A token file others can read is refused on reload too: the token stays.
    token.write_text("leaked-token\n")
    token.chmod(0o644)
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "the token stays as it was" in d.log(), 10, 0.05, "the refusal")
    assert d.status()["server"]["pid"] == pid


def test_the_unit_reloads_with_sighup() -> None:
    lines = [line.strip() for line in UNIT.read_text().splitlines()]
    assert "ExecReload=/bin/kill -HUP $MAINPID" in lines


def test_a_second_sigterm_forces_the_stop(daemon_factory: type[Daemon]) -> None:
    # A server that ignores SIGTERM, and a grace period far longer than the test waits.
    d = daemon_factory(
        gpus=2,
        timeouts={"stop_grace_s": 120.0},
        extra={"server": {"env": {"SGLANG_SIM_FAULTS": "ignore_sigterm"}}},
    ).start()
    assert d.proc is not None
    d.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "ready -> stopping" in d.log(), 30, 0.05, "the graceful stop")
    assert d.proc.poll() is None  # waiting out the grace period
    d.proc.send_signal(signal.SIGTERM)
    assert exit_code(d, 60) == 0, d.log()
    assert tagged_processes(d.instance) == []
    assert "forcing the stop" in d.log()
    assert "releasing -> stopped" in d.log()  # the release was still verified
    # One teardown of the tree: the supervisor's own (its grace cut short); the daemon's
    # sweep at exit comes after it and finds nothing left to stop.
    assert "stopped processes of this instance" not in d.log(), d.log()
