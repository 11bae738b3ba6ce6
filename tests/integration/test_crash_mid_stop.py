"""Issue 20 §7, with real daemons: an operator's stop survives a daemon SIGKILLed in the
middle of it. Before, the stop was recorded only once it had completed, so the restarted
daemon adopted (or relaunched) the server the operator was stopping."""

from __future__ import annotations

import signal

from tests.helpers import Daemon, tagged_processes, wait_until


def test_a_daemon_killed_mid_stop_is_succeeded_by_one_that_keeps_it_stopped(
    daemon_factory: type[Daemon],
) -> None:
    # A server that ignores SIGTERM and a long grace period: the stop takes a while.
    d = daemon_factory(
        gpus=2,
        timeouts={"stop_grace_s": 6.0},
        extra={"server": {"env": {"SGLANG_SIM_FAULTS": "ignore_sigterm"}}},
    ).start()
    assert d.proc is not None
    r = d.client.post("/stop", params={"wait": "false"})
    assert r.status_code == 202, r.text
    wait_until(lambda: d.status()["state"] == "stopping", 30, 0.05, "the stop's teardown")
    d.proc.send_signal(signal.SIGKILL)  # the daemon dies mid-stop
    d.proc.wait(10)
    assert tagged_processes(d.instance), "the server should still run (grace period)"

    d.start(wait_ready=False)  # the same state directory, a new daemon
    status = d.wait_state("stopped", 60)
    assert status["server"] is None
    assert tagged_processes(d.instance) == [], d.log()
    start = d.client.get("/operations").json()["operations"][-1]
    assert start["kind"] == "start" and start["state"] == "succeeded", start
    assert "an operator stopped the server" in str(start["phases"]), start
