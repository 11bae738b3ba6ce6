"""Issue 27 §4 on real processes: who listens on the server port, judged while processes
exit between the daemon's scans (``supervisor/engine/ownership.py``).

The socket table and a launch's members are two scans of a moving process table. On a
loaded host a server that crashed right after answering /health_generate was seen
listening by the first and gone by the second: "server port … is held by pid N, which is
not part of this launch (pid N)". Here the exit is put exactly between the two scans (the
real ``OsProcessOps``, whose socket scan kills the process right after it looked), so the
race is not left to the scheduler.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from sglang_supervisor.engine.ownership import held_still, judge_listeners
from sglang_supervisor.host import process
from sglang_supervisor.host.process import Launch
from sglang_supervisor.runtime import OsProcessOps
from tests.helpers import TEST_INSTANCE_PREFIX, free_port, register_tag, wait_until

HOST = "127.0.0.1"

#: Listens on argv[1]; with argv[2] == "child" a forked child holds the socket and the
#: launcher closes its own copy (a member, not the launcher, listens). Sleeps until killed.
LISTENER = """
import os, socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
if sys.argv[2] == "child" and os.fork() != 0:
    s.close()
time.sleep(600)
"""


class ExitAfterFirstScan(OsProcessOps):
    """The real process ops, but the process ``victim`` names exits (SIGKILL, waited
    for) right after the first socket scan has seen it listening."""

    def __init__(self, victim: Callable[[], int]) -> None:
        super().__init__()
        self.victim = victim
        self.scans = 0

    def port_listeners(self, host: str, port: int) -> list[int | None]:
        found = super().port_listeners(host, port)
        self.scans += 1
        if self.scans == 1:
            pid = self.victim()
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not _running(pid), 10, 0.005, f"pid {pid} to exit")
        return found


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _listeners(port: int) -> list[int | None]:
    return OsProcessOps().port_listeners(HOST, port)


@pytest.fixture
def launches(tmp_path: Path) -> Iterator[list[Launch]]:
    made: list[Launch] = []
    yield made
    for launch in made:
        for pid in process.find_members(launch, tag=launch.tag):
            os.kill(pid, signal.SIGKILL)
        if launch.popen is not None:
            launch.popen.kill()
            launch.popen.wait(10)


def _launch(tmp: Path, made: list[Launch], port: int, mode: str) -> Launch:
    """A tagged launch listening on ``port`` (``mode``: "self" or "child")."""
    tag = register_tag(f"{TEST_INSTANCE_PREFIX}-own.{uuid.uuid4().hex[:8]}")
    launch = process.spawn(
        [sys.executable, "-c", LISTENER, str(port), mode],
        os.environ,
        tag=tag,
        log_path=tmp / f"{tag}.log",
    )
    made.append(launch)

    def listening() -> bool:
        # A listener whose pid was not found yet (None: its socket seen before its fd in
        # /proc) does not count: the tests below need the pid.
        pids = [pid for pid in _listeners(port) if pid is not None]
        return launch.pid in pids if mode == "self" else bool(pids) and launch.pid not in pids

    wait_until(listening, 20, 0.02, f"the launch's listener ({mode}) on port {port}")
    return launch


def test_a_launch_that_exits_between_the_scans_is_still_the_one_that_answered(
    tmp_path: Path, launches: list[Launch]
) -> None:
    """The issue's failure: the launcher listened at the socket scan and had exited by
    the member scan. It answered; it is ours, never "not part of this launch"."""
    port = free_port()
    launch = _launch(tmp_path, launches, port, "self")
    procs = ExitAfterFirstScan(lambda: launch.pid)
    verdict = judge_listeners(procs, launch, HOST, port)
    assert procs.scans >= 1 and launch.poll(), "the launcher had exited"
    assert verdict.ours, verdict.describe(HOST, port, launch.pid)


def test_a_member_that_exits_between_the_scans_is_not_foreign(
    tmp_path: Path, launches: list[Launch]
) -> None:
    """A rank (a forked member, not the launcher) held the socket and exited after the
    socket scan: the second look finds nobody listening, so nobody is named."""
    port = free_port()
    launch = _launch(tmp_path, launches, port, "child")
    (child,) = [pid for pid in _listeners(port) if pid is not None]
    procs = ExitAfterFirstScan(lambda: child)
    verdict = judge_listeners(procs, launch, HOST, port)
    text = verdict.describe(HOST, port, launch.pid)
    assert f"pid {child}" not in text, text
    assert f"nothing listens on {HOST}:{port} any more" in text
    assert not verdict.ours and verdict.foreign == ()
    assert not _running(child)


def test_a_listener_outside_the_launch_is_named_after_two_looks(
    tmp_path: Path, launches: list[Launch]
) -> None:
    """Another process on the port (no tag, not in the launch's tree) stays foreign."""
    port = free_port()
    other = subprocess.Popen([sys.executable, "-c", LISTENER, str(port), "self"])
    try:
        wait_until(lambda: other.pid in _listeners(port), 20, 0.02, "the other listener")
        launch = _launch(tmp_path, launches, free_port(), "self")
        verdict = judge_listeners(OsProcessOps(), launch, HOST, port)
        assert not verdict.ours and verdict.foreign == (other.pid,)
        text = verdict.describe(HOST, port, launch.pid)
        assert f"is held by pid {other.pid} (" in text and "-c" in text
        assert f"not part of this launch (pid {launch.pid})" in text
    finally:
        other.kill()
        other.wait(10)


def test_a_holder_that_exits_between_the_scans_leaves_the_port_free_for_a_launch() -> None:
    """Before a launch: a listener seen by the first scan and gone by the second does not
    refuse the launch (it would name a process that no longer exists)."""
    port = free_port()
    other = subprocess.Popen([sys.executable, "-c", LISTENER, str(port), "self"])
    try:
        wait_until(lambda: other.pid in _listeners(port), 20, 0.02, "the other listener")
        procs = ExitAfterFirstScan(lambda: other.pid)
        assert held_still(procs, HOST, port) == []
        assert procs.scans == 2
    finally:
        other.kill()
        other.wait(10)
    still = subprocess.Popen([sys.executable, "-c", LISTENER, str(port), "self"])
    try:
        wait_until(lambda: still.pid in _listeners(port), 20, 0.02, "a listener that stays")
        assert held_still(OsProcessOps(), HOST, port) == [still.pid]
    finally:
        still.kill()
        still.wait(10)
