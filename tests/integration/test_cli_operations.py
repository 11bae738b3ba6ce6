"""``sglang-supervisor operations``: list, show one, follow one, against a real daemon.

What an operator sees: each operation's id, kind, outcome and lever diff; one operation's
phases in order with times counted from the operation's start, and why it rolled back; a
follower that attaches late still shows each phase at its time from the operation's start
(not from when the follower attached).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from tests.helpers import Daemon, wait_until
from tests.integration.test_cli import cli

STAMP = re.compile(r"^\s+\+(\d+\.\d\d)s\s+(\S+)\s+(\S+)")


def _offset(op: dict[str, Any], iso: str) -> float:
    t0 = datetime.fromisoformat(op["created_at"]).timestamp()
    return datetime.fromisoformat(iso).timestamp() - t0


@pytest.fixture
def daemon(daemon_factory: type[Daemon]) -> Iterator[Daemon]:
    # A start that takes long enough for a follower to attach in the middle of it.
    yield daemon_factory(sim={"startup_s": 2.0}).start()


def test_list_show_and_follow(daemon: Daemon) -> None:
    d = daemon
    ok = d.apply({"mem_fraction_static": 0.8}).json()["operation"]
    assert ok["state"] == "succeeded"
    bad = d.apply({"mem_fraction_static": 0.99}).json()["operation"]
    assert bad["state"] == "rolled_back"

    listed = cli(d, "operations")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["id", "kind", "outcome", "started", "took", "effect", "levers"]
    newest, older = lines[1], lines[2]
    assert newest.startswith(bad["id"]) and " rolled_back " in newest
    assert newest.endswith("mem_fraction_static 0.8 -> 0.99"), newest
    assert older.startswith(ok["id"]) and " succeeded " in older
    assert older.endswith("mem_fraction_static 0.85 -> 0.8"), older
    assert cli(d, "operations", "-n", "1").stdout.count("\n") == 2  # header + newest

    shown = cli(d, "operations", "show", bad["id"])
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert text.startswith(f"apply {bad['id']}: rolled_back")
    assert "levers   mem_fraction_static 0.8 -> 0.99" in text
    assert f"reason   {bad['rollback_reason']}" in text
    names = [
        ln.split()[0]
        for ln in text.split("phases (times from the operation's start):")[1].splitlines()[1:]
        if ln.startswith("    ") and not ln.startswith("      |")
    ]
    assert names == [p["name"] for p in bad["phases"]], text
    start = next(p for p in bad["phases"] if p["name"] == "start")
    at = f"+{_offset(bad, start['started_at']):.2f}s"
    assert re.search(rf"^\s+start\s+failed\s+{re.escape(at)}\s", text, re.M), text

    missing = cli(d, "operations", "show", "nosuchop")
    assert missing.returncode == 7  # not found
    assert "no operation 'nosuchop'" in missing.stderr
    usage = cli(d, "operations", "show")
    assert usage.returncode == 2 and "needs the operation's id" in usage.stderr


def test_follow_attached_late_counts_from_the_operations_start(daemon: Daemon) -> None:
    d = daemon
    op = d.apply({"mem_fraction_static": 0.8}, wait=False).json()["operation"]  # runs on

    def starting() -> bool:
        phases = d.client.get(f"/operations/{op['id']}").json()["operation"]["phases"]
        return any(p["name"] == "start" and p["state"] == "running" for p in phases)

    wait_until(starting, 30, 0.05, "the apply's start phase")
    followed = cli(d, "operations", "follow", op["id"])
    assert followed.returncode == 0, followed.stdout + followed.stderr
    final = d.client.get(f"/operations/{op['id']}").json()["operation"]
    assert followed.stdout.startswith(f"apply {op['id']}: mem_fraction_static 0.85 -> 0.8")
    ended = {}
    for line in _phase_ends(followed.stdout):
        m = STAMP.match(line)
        assert m is not None
        ended[m.group(2)] = float(m.group(1))
    assert list(ended) == [p["name"] for p in final["phases"]], followed.stdout
    for phase in final["phases"]:
        # The daemon's clock on both sides: the same whenever the follower attached
        # (it attached after the release ended, so "since attaching" would be ~0 there).
        want = _offset(final, phase["ended_at"])
        assert abs(ended[phase["name"]] - want) <= 0.011, (phase["name"], want, followed.stdout)
    assert ended["release"] > 0.05
    assert "succeeded in" in followed.stdout

    # An ended operation is shown whole at once, with the same times.
    again = cli(d, "operations", "follow", op["id"])
    assert again.returncode == 0
    assert _phase_ends(again.stdout) == _phase_ends(followed.stdout)


def _phase_ends(stdout: str) -> list[str]:
    ends = []
    for line in stdout.splitlines():
        m = STAMP.match(line)
        if m and m.group(3) != "started" and m.group(2) != "gpu":
            ends.append(line)
    return ends


def test_a_cancelled_start_reads_as_a_sentence(daemon: Daemon) -> None:
    """The reason once read "... while pid 4242 was start" (the phase name pasted in)."""
    d = daemon
    old_pid = d.status()["server"]["pid"]
    op = d.apply({"mem_fraction_static": 0.8}, wait=False).json()["operation"]

    def new_server_starting() -> bool:
        phases = d.client.get(f"/operations/{op['id']}").json()["operation"]["phases"]
        server = d.status().get("server") or {}
        launched = server.get("pid") not in (None, old_pid)
        return launched and any(p["name"] == "start" and p["state"] == "running" for p in phases)

    wait_until(new_server_starting, 30, 0.05, "the new server launched")
    assert d.client.post(f"/operations/{op['id']}/cancel").status_code == 202

    def ended() -> dict[str, Any] | None:
        o: dict[str, Any] = d.client.get(f"/operations/{op['id']}").json()["operation"]
        return None if o["state"] == "running" else o

    final = wait_until(ended, 30, 0.05, "the cancelled apply's end")
    assert final["state"] == "rolled_back"
    shown = cli(d, "operations", "show", op["id"])
    reason = next(ln for ln in shown.stdout.splitlines() if ln.startswith("  reason"))
    assert re.search(r"cancelled by an operator.* while pid \d+ was starting$", reason), reason
