"""Issue 19 §5 and §6 through real daemons and real process trees: what is known before
the stop is found before it (a router that cannot answer, an apply that changes nothing),
and the server the daemon calls ready is its own (another process on the server port,
another daemon of the same instance, a server frozen on probation)."""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest

from sglang_supervisor_api.instance_lock import socket_name
from tests.helpers import Daemon, free_port, squatter, wait_until, write_toml
from tests.integration.test_cli import cli

#: A plain HTTP server that answers 200 ``ok`` to every GET (/health_generate included,
#: and /workers with a body no sglang-router would send).
SQUATTER_CODE = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"<html>ok</html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def squat(port: int) -> subprocess.Popen[bytes]:
    """Start the plain server on ``port``; returns once it answers."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SQUATTER_CODE, str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def answers() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health_generate", timeout=1).is_success
        except httpx.HTTPError:
            return False

    wait_until(answers, 15, 0.05, f"the squatter on port {port}")
    return proc


@pytest.fixture
def squatters() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait(10)


def operation(d: Daemon, op_id: str) -> dict[str, Any]:
    data: dict[str, Any] = d.client.get(f"/operations/{op_id}").json()
    return data.get("operation", data)


def phases(op: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {p["name"]: (p["state"], p.get("detail") or "") for p in op["phases"]}


# ---------------------------------------------------------- the server port


def test_another_process_on_the_server_port_is_never_taken_for_our_server(
    daemon_factory: type[Daemon], squatters: list[subprocess.Popen[bytes]]
) -> None:
    d = daemon_factory(gpus=2)
    squatters.append(squat(d.server_port))
    pid = squatters[0].pid
    d.start(wait_ready=False)
    status = d.wait_state("failed", timeout=60)  # the crash loop ends it
    assert f"is held by pid {pid}" in status["state_reason"], status["state_reason"]
    assert "-> ready" not in d.log_path.read_text()  # never ready, not for a moment
    assert d.client.get("/readyz").status_code == 503

    r = d.client.post("/start", params={"wait": "true"})
    op = r.json()["operation"]
    assert op["state"] == "failed", op
    assert f"is held by pid {pid}" in phases(op)["start"][1]
    r = d.apply({"mem_fraction_static": 0.84})
    assert r.status_code == 422, r.text
    assert f"pid {pid}" in r.text

    squatters[0].kill()
    squatters[0].wait(10)
    op = d.client.post("/start", params={"wait": "true"}).json()["operation"]
    assert op["state"] == "succeeded", op
    assert d.status()["server"]["pid"] != pid


class _Answer200(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


def test_a_launch_whose_own_bind_fails_never_becomes_ready(daemon_factory: type[Daemon]) -> None:
    """The port is free at the check before the launch; the test takes it while the
    launcher is still starting (before it binds): /health_generate answers 200, but not
    from the launch, which fails to bind and exits. Never ``ready``."""
    d = daemon_factory(gpus=2, sim={"startup_s": 0.5})
    d.spawn()

    def launched() -> bool:
        s = d.status_or_none()
        return s is not None and s["state"] == "starting" and s["server"] is not None

    wait_until(launched, 120, 0.005, "the first launch")
    try:
        squatter = http.server.ThreadingHTTPServer(("127.0.0.1", d.server_port), _Answer200)
    except OSError:
        pytest.skip("the launch bound the port first (the machine was fast): no race to test")
    thread = threading.Thread(target=squatter.serve_forever, daemon=True)
    thread.start()
    try:
        status = d.wait_state("failed", timeout=90)
        assert "-> ready" not in d.log_path.read_text()
        assert f"is held by pid {os.getpid()}" in status["state_reason"]
    finally:
        squatter.shutdown()
        squatter.server_close()


# ------------------------------------------------------------ the instance


def wait_exit(proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    return wait_until(lambda: proc.poll() is not None, timeout, 0.05, "the daemon to exit") and (
        proc.returncode
    )


@pytest.mark.parametrize("squatted", [False, True], ids=["alone", "beside-a-squatter"])
def test_a_second_daemon_of_the_same_instance_exits_and_touches_nothing(
    daemon_factory: type[Daemon], squatted: bool
) -> None:
    """Another state dir, the same ``instance`` (a copied config): the newcomer exits 2
    naming the owner; the first daemon's server keeps its pid. And with uid 65534 holding
    the instance's abstract name first (issue 27 §3: the daemon then exited 2 "already
    owned", cleanup refused, and RestartPreventExitStatus=2 kept the service down), the
    first daemon starts all the same and the rule holds against the second."""
    with contextlib.ExitStack() as stack:
        first = daemon_factory(gpus=2)
        if squatted:
            stack.enter_context(squatter(socket_name(first.instance)))
        first.start()
        _second_daemon_refused(daemon_factory, first)


def _second_daemon_refused(daemon_factory: type[Daemon], first: Daemon) -> None:
    assert first.proc is not None
    server_pid = first.status()["server"]["pid"]
    second = daemon_factory(gpus=2, extra={"instance": first.instance})
    proc = second.spawn()
    assert wait_exit(proc) == 2, second.log()
    assert f"daemon pid {first.proc.pid}" in second.log()
    assert f"instance {first.instance!r}" in second.log()
    status = first.status()
    assert status["state"] == "ready" and status["server"]["pid"] == server_pid
    assert psutil.pid_exists(server_pid)
    # Nor does `cleanup` with the copied config tear down the first daemon's server.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_supervisor_api.cli",
            "cleanup",
            "--config",
            str(second.config_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"pid {first.proc.pid}" in out.stderr
    assert first.status()["server"]["pid"] == server_pid


def test_deleting_the_state_dir_under_a_daemon_does_not_let_a_second_one_in(
    daemon_factory: type[Daemon],
) -> None:
    """The state dir (and its lock file) deleted under a running daemon, then a second
    daemon started on the same path: it exits 2 naming the first; the server survives."""
    first = daemon_factory(gpus=2).start()
    assert first.proc is not None
    server_pid = first.status()["server"]["pid"]
    second = daemon_factory(gpus=2)
    config = tomllib.loads(first.config_path.read_text())
    config["api"]["port"] = second.port  # the same state dir and instance, another API port
    write_toml(second.config_path, config)
    subprocess.run(["rm", "-rf", config["state_dir"]], check=True)
    proc = second.spawn()
    assert wait_exit(proc) == 2, second.log()
    assert f"daemon pid {first.proc.pid}" in second.log()
    assert psutil.pid_exists(server_pid)
    assert first.status()["server"]["pid"] == server_pid
    # The first daemon's exit may find its state dir gone: only its server matters here.
    first.stop()


# --------------------------------------------------------------- probation


def test_a_frozen_new_server_fails_probation_within_its_window(
    daemon_factory: type[Daemon],
) -> None:
    """SIGSTOP the new launcher right after ready, probation_s = 2, probes with a 30 s
    timeout: the apply rolls back in about probation_s + the stop's grace, not 3 x 30 s;
    meanwhile /status shows the probation and /readyz answers 503."""
    d = daemon_factory(
        gpus=2,
        timeouts={"probation_s": 2.0, "liveness_timeout_s": 30.0, "liveness_failures": 3},
    ).start()
    old_pid = d.status()["server"]["pid"]
    r = d.apply({"mem_fraction_static": 0.84}, wait=False)
    assert r.status_code in (200, 202), r.text
    op_id = r.json()["operation"]["id"]

    def on_probation() -> dict[str, Any] | None:
        s = d.status()
        p = s.get("probation")
        return s if p is not None and p["pid"] != old_pid else None

    status = wait_until(on_probation, 60, 0.02, "the new server's probation")
    new_pid = status["probation"]["pid"]
    os.kill(new_pid, signal.SIGSTOP)
    assert status["state"] == "ready" and status["probation"]["until"]
    ready = d.client.get("/readyz")
    assert ready.status_code == 503 and "on probation" in ready.json()["reason"]

    started = time.monotonic()
    op = wait_until(
        lambda: (o := operation(d, op_id))["state"] != "running" and o,
        45,  # generous; unbounded probes took 90 s
        0.1,
        "the apply to end",
    )
    assert op["state"] == "rolled_back", op
    state, detail = phases(op)["probation"]
    assert state == "failed" and "end of the probation window" in detail, detail
    status = d.wait_state("ready")
    assert status["levers"]["mem_fraction_static"] == 0.85 and status["probation"] is None
    assert not psutil.pid_exists(new_pid) or psutil.Process(new_pid).status() == "zombie"
    assert d.client.get("/readyz").status_code == 200
    print(f"rolled back {time.monotonic() - started:.1f}s after the SIGSTOP")


# ------------------------------------------------------- before the stop


def test_an_apply_of_the_serving_levers_restarts_nothing(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory(gpus=2).start()
    pid = d.status()["server"]["pid"]
    dry = d.apply({"mem_fraction_static": 0.85}, dry_run=True).json()["operation"]
    assert "would change nothing (the server would not be restarted)" in dry["phases"][-1]["detail"]
    op = d.apply({"mem_fraction_static": 0.85}).json()["operation"]
    assert op["state"] == "succeeded", op
    assert [p["name"] for p in op["phases"]] == ["validate", "preflight", "commit"]
    assert f"nothing changed: pid {pid}" in op["phases"][-1]["detail"]
    assert d.status()["server"]["pid"] == pid

    op = d.apply({"mem_fraction_static": 0.85}, force_restart=True).json()["operation"]
    assert op["state"] == "succeeded", op
    assert d.status()["server"]["pid"] != pid


def test_the_cli_restarts_serving_levers_only_when_forced(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory(gpus=2).start()
    pid = d.status()["server"]["pid"]
    r = cli(d, "apply", "--set", "mem_fraction_static=0.85")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "nothing changed" in r.stdout and d.status()["server"]["pid"] == pid
    r = cli(d, "apply", "--set", "mem_fraction_static=0.85", "--force-restart")
    assert r.returncode == 0, r.stdout + r.stderr
    assert d.status()["server"]["pid"] != pid


@pytest.mark.parametrize("kind", ["unreachable", "garbage"])
def test_a_router_that_cannot_answer_refuses_the_apply_before_the_stop(
    daemon_factory: type[Daemon], squatters: list[subprocess.Popen[bytes]], kind: str
) -> None:
    port = free_port()
    if kind == "garbage":
        squatters.append(squat(port))
    url = f"http://127.0.0.1:{port}"
    d = daemon_factory(gpus=2, extra={"router": {"url": url, "request_timeout_s": 1.0}})
    d.start()
    pid = d.status()["server"]["pid"]
    r = d.apply({"mem_fraction_static": 0.84})
    assert r.status_code == 422, r.text
    (problem,) = r.json()["detail"]["problems"]
    assert problem["lever"] == "router"
    assert f"{url}/workers" in problem["message"] and "without_router" in problem["message"]
    status = d.status()
    assert status["server"]["pid"] == pid and status["levers"]["mem_fraction_static"] == 0.85

    r2 = cli(d, "apply", "--set", "mem_fraction_static=0.84")
    assert r2.returncode == 2 and f"{url}/workers" in r2.stdout + r2.stderr, r2

    r3 = cli(d, "apply", "--set", "mem_fraction_static=0.84", "--without-router")
    assert r3.returncode == 0, r3.stdout + r3.stderr  # not rolled back for the router
    assert d.status()["levers"]["mem_fraction_static"] == 0.84
    op = d.apply({"mem_fraction_static": 0.83}, without_router=True).json()["operation"]
    assert op["state"] == "succeeded", op
    assert "outside the router (without_router)" in op["phases"][-1]["detail"]
