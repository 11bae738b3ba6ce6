"""Issue 20 §4: /events streams of a real daemon.

A stream opened before a SIGHUP token rotation ends (it was authorised with the old
token); a client that disconnects leaves no read pending in the daemon ("Task was
destroyed but it is pending!", 13 times in 10 minutes with one browser tab open)."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx

from tests.helpers import Daemon, wait_until

DESTROYED = "Task was destroyed but it is pending"


def test_a_stream_opened_before_a_token_rotation_is_closed(
    daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("old-token\n")
    token.chmod(0o600)
    d = daemon_factory(gpus=2, extra={"api": {"token_file": str(token)}})
    d.client.headers["Authorization"] = "Bearer old-token"
    d.start()
    assert d.proc is not None
    lines: list[str] = []
    opened, ended = threading.Event(), threading.Event()

    def listen() -> None:
        headers = {"Authorization": "Bearer old-token"}
        try:
            with httpx.stream(
                "GET", f"{d.url}/events", headers=headers, timeout=120, trust_env=False
            ) as r:
                for line in r.iter_lines():
                    lines.append(line)
                    opened.set()
        except httpx.HTTPError as exc:
            lines.append(f"broken: {exc!r}")
        ended.set()

    threading.Thread(target=listen, daemon=True).start()
    assert opened.wait(10)
    token.write_text("new-token\n")
    d.proc.send_signal(signal.SIGHUP)
    # Well before the stream's 15 s keep-alive: the rotation itself ends it.
    assert ended.wait(8), f"the old token's stream is still open: {lines[-5:]}\n{d.log()}"
    assert not any(line.startswith("broken") for line in lines), lines
    d.client.headers["Authorization"] = "Bearer new-token"
    assert d.status()["state"] == "ready"


def test_clients_that_disconnect_leave_no_pending_read(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory(gpus=2).start()
    for _ in range(20):
        with httpx.stream("GET", f"{d.url}/events", timeout=10, trust_env=False) as r:
            next(r.iter_lines())  # the stream's opening comment: it is subscribed
        # Gone mid-wait: the daemon notices it at its next is_disconnected check.
    # Events make every open wait wake up (a transition each way).
    r = d.client.post("/restart", params={"wait": "true"})
    assert r.status_code == 200, r.text
    time.sleep(0.5)  # the loop's garbage collector sees the dropped reads (if any)
    assert d.stop() == 0
    wait_until(lambda: d.proc is not None and d.proc.poll() is not None, 10)
    assert DESTROYED not in d.log(), d.log()
