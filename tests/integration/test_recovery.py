"""The daemon dies (SIGKILL) at every step of its work and is started again.

What must hold: a healthy server is adopted, not restarted (no model reload); otherwise
the server ends on the new or the last-good levers, with exactly one launch's processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import psutil

from tests.helpers import TAG_ENV, Daemon, tagged_processes, wait_until


def kill_daemon(d: Daemon) -> None:
    assert d.proc is not None
    d.proc.kill()
    d.proc.wait(10)


def launches(d: Daemon) -> set[str]:
    tags = set()
    for p in tagged_processes(d.instance):
        try:
            tags.add(p.environ()[TAG_ENV])
        except (psutil.Error, KeyError):
            continue
    return tags


def consistent(d: Daemon) -> dict[str, Any]:
    s = d.wait_state("ready", timeout=60)
    assert len(launches(d)) == 1, launches(d)
    assert s["last_good_levers"]["levers"] == s["levers"]
    assert s["last_good_levers"]["env"] == s["env"]
    for g in s["gpus"]:
        assert len(g["processes"]) == 1 and g["processes"][0]["member"]
    return s


def test_sigkill_while_ready_adopts_the_same_server(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory().start()
    before = d.status()
    kill_daemon(d)
    assert d.status_or_none() is None
    d.start()
    after = consistent(d)
    assert after["server"]["pid"] == before["server"]["pid"]
    assert after["restarts"] == 0
    assert after["levers"] == before["levers"]
    op_ids = [e for e in d.client.get("/status").json()["warnings"]]
    assert not any("leftover" in w for w in op_ids)
    # The adopted server is watched like our own: killing it is a crash we recover from.
    psutil.Process(after["server"]["pid"]).kill()
    wait_until(lambda: d.status()["restarts"] == 1, 30, 0.05, "the restart")


def test_sigkill_during_stop(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory(timeouts={"stop_grace_s": 5.0}).start()
    assert d.apply(env={"SGLANG_SIM_FAULTS": "ignore_sigterm"}).json()["operation"]["state"] == (
        "succeeded"
    )
    pid = d.status()["server"]["pid"]
    d.apply({"mem_fraction_static": 0.8}, wait=False)
    wait_until(lambda: d.status()["state"] == "stopping", 10, 0.01, "stopping")
    kill_daemon(d)
    d.start(wait_ready=False)
    s = consistent(d)
    # The old server ignored SIGTERM and still serves: it is adopted, on the last-good levers.
    assert s["server"]["pid"] == pid
    assert s["levers"]["mem_fraction_static"] == 0.85


def test_sigkill_during_release(daemon_factory: type[Daemon]) -> None:
    # 60 clean samples 50 ms apart: release takes ≥ 3 s, long enough to be killed in.
    d = daemon_factory(timeouts={"release_samples": 60, "release_interval_s": 0.05}).start()
    d.apply({"mem_fraction_static": 0.8}, wait=False)
    wait_until(lambda: d.status()["state"] == "releasing", 20, 0.01, "releasing")
    kill_daemon(d)
    d.start(wait_ready=False)
    s = consistent(d)
    assert s["levers"]["mem_fraction_static"] == 0.85  # the interrupted apply rolled back


def test_sigkill_during_start(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory().start()
    d.apply({"mem_fraction_static": 0.8}, env={"SGLANG_SIM_STARTUP_S": "5"}, wait=False)
    wait_until(lambda: d.status()["state"] == "starting", 20, 0.01, "starting")
    kill_daemon(d)
    d.start(wait_ready=False)
    s = consistent(d)
    assert s["levers"]["mem_fraction_static"] == 0.85
    assert s["env"] == {}


def test_sigkill_after_new_levers_are_ready_keeps_them(daemon_factory: type[Daemon]) -> None:
    # Killed in the probation window: the new server is healthy, so it is adopted and the
    # interrupted apply is finished rather than undone.
    d = daemon_factory(timeouts={"probation_s": 10.0}).start()
    d.apply({"mem_fraction_static": 0.8}, wait=False)
    wait_until(
        lambda: (
            (op := d.status()["operation"]) is not None
            and any(p["name"] == "probation" for p in op["phases"])
        ),
        30,
        0.01,
        "the probation phase",
    )
    pid = d.status()["server"]["pid"]
    kill_daemon(d)
    d.start(wait_ready=False)
    s = consistent(d)
    assert s["server"]["pid"] == pid
    assert s["levers"]["mem_fraction_static"] == 0.8


def test_keep_server_mode_survives_a_daemon_restart(daemon_factory: type[Daemon]) -> None:
    # The KillMode=process drop-in: the daemon's SIGTERM leaves the server for the next one.
    d = daemon_factory()
    d.env["SGLANG_SUPERVISOR_KEEP_SERVER"] = "1"
    d.start()
    pid = d.status()["server"]["pid"]
    assert d.stop() == 0
    assert any(p.pid == pid for p in tagged_processes(d.instance))
    d.start()
    s = consistent(d)
    assert s["server"]["pid"] == pid and s["restarts"] == 0
    # Without the mode, a stop takes the server down with the daemon.
    assert d.stop() == 0
    d.env.clear()
    d.start()
    assert d.stop() == 0
    assert tagged_processes(d.instance) == []


def test_cleanup_command_stops_what_a_kept_server_left(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory()
    d.env["SGLANG_SUPERVISOR_KEEP_SERVER"] = "1"
    d.start()
    assert d.stop() == 0
    assert tagged_processes(d.instance), "keep mode left nothing running"
    cmd = [
        sys.executable,
        "-m",
        "sglang_supervisor_api.cli",
        "cleanup",
        "--config",
        str(d.config_path),
    ]
    env = {k: v for k, v in os.environ.items() if k != "SERVICE_RESULT"}
    # After a failure systemd's ExecStopPost must keep the server for the next daemon.
    kept = subprocess.run(
        [*cmd, "--only-if-stopped"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "SERVICE_RESULT": "exit-code"},
        check=False,
    )
    assert kept.returncode == 0 and "skipped" in kept.stdout
    assert tagged_processes(d.instance)
    out = subprocess.run(
        [*cmd, "--only-if-stopped"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "SERVICE_RESULT": "success"},
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "member processes exited" in out.stdout
    assert tagged_processes(d.instance) == []


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cancel_the_start_up(d: Daemon, when: Any) -> dict[str, Any]:
    """Wait until ``when(status)``, cancel the start-up operation then running, and
    return it once it has ended."""

    def due() -> dict[str, Any] | None:
        s = d.status_or_none()
        return s if s is not None and s["operation"] is not None and when(s) else None

    s = wait_until(due, 60, 0.005, "the adoption")
    op_id = s["operation"]["id"]
    r = d.client.post(f"/operations/{op_id}/cancel")
    assert r.status_code in (200, 202), r.text

    def ended() -> dict[str, Any] | None:
        op: dict[str, Any] = d.client.get(f"/operations/{op_id}").json()["operation"]
        return op if op["state"] != "running" else None

    return wait_until(ended, 60, 0.05, "the start-up operation to end")


def test_cancelling_the_adoption_of_a_loading_server_is_an_operators_stop(
    daemon_factory: type[Daemon],
) -> None:
    """Issue 27 §7: a daemon killed while its server loads; the next one adopts it, still
    loading, and the operator cancels that start-up. That is a stop: the server is torn
    down and stays stopped across the daemon's next restart (before, the next start
    launched a new server)."""
    d = daemon_factory(sim={"startup_s": 60}, timeouts={"ready_timeout_s": 120})
    d.start(wait_ready=False)
    s = wait_until(lambda: (s := d.status_or_none()) and s["server"] and s, 30, 0.02, "a launch")
    pid = s["server"]["pid"]
    kill_daemon(d)
    d.start(wait_ready=False)

    def adopting(s: dict[str, Any]) -> bool:
        return s["state"] == "starting" and "adopting" in s["state_reason"]

    op = _cancel_the_start_up(d, adopting)
    assert op["state"] == "failed" and "cancelled by an operator" in op["error"], op
    assert f"the adopted server (pid {pid}) was torn down" in op["error"]
    s = d.wait_state("stopped")
    assert s["server"] is None and not _running(pid)
    assert d.stop() == 0
    d.start(wait_ready=False)
    s = d.wait_state("stopped")
    assert s["server"] is None and tagged_processes(d.instance) == [], "it launched again"
    assert "an operator stopped the server" in s["state_reason"], s["state_reason"]
