"""Teardown of real process trees that misbehave on purpose.

Each test asserts what matters: no member process is left alive, and nothing outside the
tree was touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sglang_supervisor.host import process, teardown
from sglang_supervisor.host.process import Launch
from tests.helpers import TEST_INSTANCE_PREFIX, register_tag, wait_until

TREE = Path(__file__).with_name("tree.py")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class Tree:
    def __init__(self, tmp: Path, *args: str, expect: int) -> None:
        self.ready_dir = tmp / f"ready-{uuid.uuid4().hex[:6]}"
        self.ready_dir.mkdir()
        self.tag = register_tag(f"{TEST_INSTANCE_PREFIX}-tree.{uuid.uuid4().hex[:8]}")
        self.launch: Launch = process.spawn(
            [sys.executable, str(TREE), str(self.ready_dir), *args],
            os.environ,
            tag=self.tag,
            log_path=tmp / "tree.log",
        )
        wait_until(lambda: len(self.pids()) >= expect, 20, what=f"{expect} processes ready")

    def pids(self) -> list[int]:
        return sorted(int(p.name) for p in self.ready_dir.iterdir() if p.name.isdigit())

    def alive(self) -> list[int]:
        return [p for p in self.pids() if _alive(p)]

    def teardown(self, grace_s: float = 1.0) -> teardown.TeardownReport:
        return teardown.teardown(self.launch, tag=self.tag, grace_s=grace_s, kill_timeout_s=10)


@pytest.fixture
def trees(tmp_path: Path) -> Iterator[list[Tree]]:
    made: list[Tree] = []
    yield made
    for t in made:  # whatever a failed test left behind
        for pid in t.alive():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        process.reap(t.launch, t.pids())


def test_plain_tree_exits_on_sigterm(tmp_path: Path, trees: list[Tree]) -> None:
    t = Tree(tmp_path, "--children", "3", "--grandchildren", expect=7)
    trees.append(t)
    report = t.teardown()
    assert report.clean and report.sigkill_sent == []
    assert set(t.pids()) <= set(report.members)
    assert t.alive() == []
    assert t.launch.returncode == -signal.SIGTERM


def test_a_log_that_cannot_be_written_never_stops_a_launch(tmp_path: Path) -> None:
    """The logs directory is not writable (here: a file stands where it should be; root
    ignores permissions): the server still starts, its output going to our own."""
    blocked = tmp_path / "logs"
    blocked.write_text("not a directory")
    tag = register_tag(f"{TEST_INSTANCE_PREFIX}-log.{uuid.uuid4().hex[:8]}")
    launch = process.spawn(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        os.environ,
        tag=tag,
        log_path=blocked / "server.log",
    )
    try:
        assert not launch.poll()
        assert _alive(launch.pid)
    finally:
        report = teardown.teardown(launch, tag=tag, grace_s=5, kill_timeout_s=5)
    assert report.clean and not _alive(launch.pid)


def test_a_grace_period_cut_short_sigkills_at_once(tmp_path: Path, trees: list[Tree]) -> None:
    """A forced shutdown (``cut_grace`` true) during a 60 s grace: SIGKILL now."""
    t = Tree(tmp_path, "--children", "2", "--ignore-term", expect=3)
    trees.append(t)
    asked = []

    def cut() -> bool:
        asked.append(True)
        return len(asked) > 3  # a few polls into the grace period

    report = teardown.teardown(t.launch, tag=t.tag, grace_s=60.0, kill_timeout_s=10, cut_grace=cut)
    assert report.clean
    assert sorted(report.sigkill_sent) == sorted(t.pids())
    assert report.kill_after_s is not None and report.kill_after_s < 60.0
    assert t.alive() == []


def test_tree_ignoring_sigterm_is_sigkilled_after_grace(tmp_path: Path, trees: list[Tree]) -> None:
    t = Tree(tmp_path, "--children", "3", "--ignore-term", expect=4)
    trees.append(t)
    report = t.teardown(grace_s=0.3)
    assert report.clean
    assert report.kill_after_s is not None and report.kill_after_s >= 0.3
    assert set(report.sigkill_sent) == set(t.pids())
    assert t.alive() == []
    assert "SIGKILL" in report.describe()


def test_children_that_setsid_are_found_by_tag(tmp_path: Path, trees: list[Tree]) -> None:
    t = Tree(tmp_path, "--children", "2", "--grandchildren", "--setsid", "--ignore-term", expect=5)
    trees.append(t)
    leader = t.launch.pid
    escaped = [p for p in t.pids() if p != leader and os.getsid(p) != leader]
    assert escaped, "the children did not leave the session"
    report = t.teardown(grace_s=0.2)
    assert report.clean and t.alive() == []


def test_members_outside_the_group_get_their_own_sigterm(tmp_path: Path, trees: list[Tree]) -> None:
    """Ranks that left the group (setsid) exit on SIGTERM like the rest: once the launcher
    has exited (stage 1-2), the members still alive get a SIGTERM each (stage 3), not
    only the group. SIGKILL is never needed."""
    t = Tree(tmp_path, "--children", "2", "--grandchildren", "--setsid", expect=5)
    trees.append(t)
    leader = t.launch.pid
    assert all(os.getpgid(p) != leader for p in t.pids() if p != leader)
    report = t.teardown(grace_s=10.0)
    assert report.clean and t.alive() == []
    assert report.sigkill_sent == [] and report.kill_after_s is None, report.describe()
    assert report.ended_by == "sigterm"
    assert set(report.members_sigterm) == set(t.pids()) - {leader}


def test_the_launcher_drains_with_its_workers_alive(tmp_path: Path, trees: list[Tree]) -> None:
    """SGLang 0.5.23's launcher drains on SIGTERM while its workers, which have no SIGTERM
    handler of their own, keep generating (scheduler.py:6257-6300, detokenizer_manager.py
    :545-569: no handler installed; tokenizer_manager.py:3508-3548: the drain, then
    kill_process_tree, utils/common.py:2507). So the first SIGTERM goes to the launcher
    alone: here it serves on 0.5 s and exits 0 only if every worker was still alive then
    (a worker killed meanwhile cuts the requests: exit 1). No member needs a signal of its
    own."""
    t = Tree(tmp_path, "--children", "2", "--drain-s", "0.5", expect=3)
    trees.append(t)
    report = t.teardown(grace_s=10.0)
    assert t.launch.returncode == 0, f"a worker died during the drain: {report.describe()}"
    assert report.clean and t.alive() == []
    assert report.sigterm_sent == [t.launch.pid]
    assert report.members_sigterm == [] and report.sigkill_sent == []
    assert report.ended_by == "launcher"
    assert report.launcher_exit_s is not None and report.launcher_exit_s >= 0.5
    assert f"launcher (pid {t.launch.pid}) drained and exited in" in report.describe()


def test_a_launcher_past_its_grace_is_stopped_with_its_workers(
    tmp_path: Path, trees: list[Tree]
) -> None:
    """A drain longer than the grace: the launcher and its workers get SIGTERM when the
    grace is over (the workers die of it, the draining launcher does not) and the
    launcher SIGKILL after the short member wait."""
    t = Tree(tmp_path, "--children", "2", "--drain-s", "60", expect=3)
    trees.append(t)
    report = t.teardown(grace_s=0.3)
    assert report.clean and t.alive() == []
    assert report.launcher_exit_s is None and report.ended_by == "sigkill"
    assert set(report.members_sigterm) == set(t.pids())
    assert report.sigkill_sent == [t.launch.pid]
    assert report.kill_after_s is not None and report.kill_after_s >= 0.3
    assert t.launch.returncode == -signal.SIGKILL
    assert "still running after the 0.3s grace" in report.describe()


def test_a_forced_stop_does_not_wait_for_the_drain(tmp_path: Path, trees: list[Tree]) -> None:
    t = Tree(tmp_path, "--children", "1", "--drain-s", "60", expect=2)
    trees.append(t)
    report = t.teardown(grace_s=0.0)
    assert report.clean and t.alive() == []
    assert report.sigkill_sent == [t.launch.pid]
    assert "forced stop" in report.describe()


def test_a_detached_rank_ignoring_sigterm_is_sigkilled(tmp_path: Path, trees: list[Tree]) -> None:
    """The launcher exits on its SIGTERM at once; its children left its session and
    ignore SIGTERM: they get theirs at the members' stage, then SIGKILL within the grace."""
    t = Tree(tmp_path, "--children", "2", "--setsid", "--children-ignore-term", expect=3)
    trees.append(t)
    leader = t.launch.pid
    ranks = [p for p in t.pids() if p != leader]
    assert all(os.getsid(p) != leader for p in ranks)
    report = t.teardown(grace_s=1.0)
    assert report.clean and t.alive() == []
    assert report.launcher_exit_s is not None
    assert sorted(report.members_sigterm) == sorted(ranks)
    assert sorted(report.sigkill_sent) == sorted(ranks)
    assert report.ended_by == "sigkill"


def test_an_untagged_member_of_the_group_is_found(tmp_path: Path, trees: list[Tree]) -> None:
    """A process of the launcher's group with no launch tag and no descendant of the
    launcher (its parent exited) is still a member: it ignores SIGTERM and gets SIGKILL."""
    t = Tree(tmp_path, "--untagged-orphan", expect=2)
    trees.append(t)
    leader = t.launch.pid
    (orphan,) = [p for p in t.pids() if p != leader]
    assert os.getpgid(orphan) == leader
    assert orphan not in {c.pid for c in psutil.Process(leader).children(recursive=True)}
    assert b"SGLANG_SUPERVISOR_INSTANCE=" not in Path(f"/proc/{orphan}/environ").read_bytes()
    report = t.teardown(grace_s=0.3)
    assert orphan in report.sigkill_sent
    assert report.clean and t.alive() == []


def test_orphans_of_a_killed_leader_are_found_by_tag(tmp_path: Path, trees: list[Tree]) -> None:
    t = Tree(tmp_path, "--children", "3", "--setsid", expect=4)
    trees.append(t)
    os.kill(t.launch.pid, signal.SIGKILL)
    wait_until(t.launch.poll, 10, what="the leader to exit")
    orphans = [p for p in t.alive() if p != t.launch.pid]
    assert len(orphans) == 3, "killing the leader alone must leave its children running"
    report = teardown.teardown(None, tag=t.tag, grace_s=1, kill_timeout_s=10)
    assert set(orphans) <= set(report.members)
    assert t.alive() == []


def test_a_child_born_during_the_grace_period_is_killed(tmp_path: Path, trees: list[Tree]) -> None:
    t = Tree(tmp_path, "--children", "1", "--spawn-late-s", "0.1", expect=2)
    trees.append(t)
    report = t.teardown(grace_s=1.0)
    assert report.clean
    assert len(report.members) >= 3, report.members  # leader, child, the late one
    assert t.alive() == []


def test_processes_outside_the_tree_are_never_touched(tmp_path: Path, trees: list[Tree]) -> None:
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        t = Tree(tmp_path, "--children", "2", expect=3)
        trees.append(t)
        report = t.teardown()
        assert report.clean
        assert bystander.pid not in report.members
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait(10)


def test_spawn_failure_names_the_program(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="/nonexistent/python"):
        process.spawn(["/nonexistent/python", "-V"], {}, tag="x", log_path=tmp_path / "l.log")


def test_output_goes_to_the_log_file(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    launch = process.spawn(
        [sys.executable, "-c", "print('hello'); import sys; print('oops', file=sys.stderr)"],
        os.environ,
        tag="t",
        log_path=log,
    )
    wait_until(launch.poll, 10, what="exit")
    assert launch.returncode == 0
    assert log.read_text().split() == ["hello", "oops"]


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (0, "exited with code 0"),
        (1, "exited with code 1"),
        (-9, "SIGKILL"),
        (-11, "SIGSEGV"),
        (None, "status unknown"),
    ],
)
def test_exit_statuses_explain_themselves(code: int | None, text: str) -> None:
    assert text in process.describe_exit(code)
