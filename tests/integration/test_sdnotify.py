"""systemd's notify protocol, as a Type=notify unit would see it: a datagram socket."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from tests.helpers import Daemon


def test_ready_status_watchdog_and_stopping_reach_systemd(
    daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.2)
    d = daemon_factory()
    d.env.update({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "1000000"})
    messages: list[str] = []

    def drain(until: str, times: int = 1, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while sum(until in m for m in messages) < times:
            assert time.monotonic() < deadline, f"no {until!r} in {messages}"
            try:
                messages.append(sock.recv(4096).decode())
            except TimeoutError:
                continue

    try:
        d.start()
        drain("READY=1")
        drain("STATUS=server ready")
        drain("WATCHDOG=1", times=2)  # periodic pings, not a single one
        assert d.stop() == 0
        drain("STOPPING=1")
        drain("STATUS=server stopped")
    finally:
        sock.close()
    ready = next(m for m in messages if "READY=1" in m)
    assert "STATUS=API listening" in ready
    stopping = next(m for m in messages if "STOPPING=1" in m)
    assert "EXTEND_TIMEOUT_USEC=" in stopping
    assert any("STATUS=server stopped" in m for m in messages)
