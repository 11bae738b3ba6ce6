"""Cancelling an operation from the command line: ``sglang-supervisor cancel``, and Ctrl-C
while ``apply`` follows one (it offers the cancel on a terminal). A start that never
becomes ready (the simulated server's ``hang_on_start``) ends at once and rolls back,
instead of waiting out ``ready_timeout_s``."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from typing import Any

from tests.helpers import Daemon, proc_state, wait_until
from tests.integration.test_cli import REPO, _env, cli

HANG = {"SGLANG_SIM_FAULTS": "hang_on_start"}
APPLY_HANGING = ["--set", "mem_fraction_static=0.8", "--env", "SGLANG_SIM_FAULTS=hang_on_start"]


def start_running(d: Daemon, op_id: str) -> bool:
    op: dict[str, Any] = d.client.get(f"/operations/{op_id}").json()["operation"]
    return any(p["name"] == "start" and p["state"] == "running" for p in op["phases"])


def test_cancel_ends_a_hung_start_and_rolls_back(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory(gpus=2, timeouts={"ready_timeout_s": 600}).start()
    before = d.status()
    r = d.apply({"mem_fraction_static": 0.8}, env=HANG, wait=False)
    op_id = r.json()["operation"]["id"]
    wait_until(lambda: start_running(d, op_id), 30, 0.05, "the hung start")

    done = cli(d, "cancel")
    assert done.returncode == 3, done.stdout + done.stderr  # rolled back
    assert f"apply {op_id}" in done.stdout and "rolled back" in done.stdout
    after = d.wait_state("ready")
    assert after["levers"] == before["levers"]  # the last-good levers serve again
    assert after["server"]["pid"] != before["server"]["pid"]

    again = cli(d, "cancel", op_id)
    assert again.returncode == 1
    assert f"operation {op_id} has already ended: rolled_back" in again.stderr
    nothing = cli(d, "cancel")
    assert nothing.returncode == 1 and "no operation is running" in nothing.stderr


def read_until(fd: int, text: str, timeout: float, pid: int | None = None) -> str:
    """What the pseudo-terminal shows until ``text`` appears (``pid``: the process whose
    kernel state a failure reports)."""
    seen = ""
    deadline = time.monotonic() + timeout
    while text not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            state = "" if pid is None else f" ({proc_state(pid)})"
            raise AssertionError(f"{text!r} not shown within {timeout}s{state}; shown:\n{seen}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the process ended: nothing more to read
                break
            seen += chunk.decode(errors="replace")
    return seen


def test_ctrl_c_while_following_offers_to_cancel(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory(gpus=2, timeouts={"ready_timeout_s": 600}).start()
    before = d.status()
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sglang_supervisor_api.cli",
            "apply",
            "--url",
            d.url,
            *APPLY_HANGING,
        ],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=REPO,
        env=_env(),
    )
    os.close(slave)
    try:
        shown = read_until(master, "start             started", 60)
        proc.send_signal(signal.SIGINT)
        shown += read_until(master, "[y/N]", 30, proc.pid)
        os.write(master, b"y\n")
        shown += read_until(master, "the last-good levers serve again", 60)
        assert proc.wait(30) == 3, shown  # rolled back
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        os.close(master)
    assert "cancel requested" in shown
    assert d.wait_state("ready")["levers"] == before["levers"]
