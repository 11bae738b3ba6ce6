"""The server's environment under systemd: systemd's main-process handles are not passed
on, and SGLang's Prometheus multiprocess directory lives under the state directory (not
in the unit's private /tmp, which systemd deletes when the daemon stops)."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.helpers import Daemon


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs}


def test_server_gets_no_systemd_handles_and_a_multiproc_dir_under_the_state_dir(
    daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    d = daemon_factory()
    d.env.update(
        {
            "NOTIFY_SOCKET": str(path),
            "WATCHDOG_USEC": "60000000",
            "WATCHDOG_PID": "1",  # not ours: the daemon does not ping, the test stays quiet
            "LISTEN_FDS": "1",
            "LISTEN_PID": "1",
            "LISTEN_FDNAMES": "api",
            "SGLANG_SUPERVISOR_KEEP_SERVER": "0",
        }
    )
    try:
        status = d.start().status()
        env = environ_of(status["server"]["pid"])
        leaked = sorted(
            k
            for k in env
            if k in {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"}
            or k.startswith("LISTEN_")
            or (k.startswith("SGLANG_SUPERVISOR_") and k != "SGLANG_SUPERVISOR_INSTANCE")
        )
        assert leaked == [], f"the server inherited the daemon's {leaked}"
        state_dir = Path(d.dir / "state")
        assert env["PROMETHEUS_MULTIPROC_DIR"] == str(state_dir / "prometheus")
        assert (state_dir / "prometheus").is_dir()
    finally:
        sock.close()


def test_an_operators_multiproc_dir_is_kept(daemon_factory: type[Daemon], tmp_path: Path) -> None:
    own = tmp_path / "metrics-dir"
    own.mkdir()
    d = daemon_factory()
    d.env["PROMETHEUS_MULTIPROC_DIR"] = str(own)
    env = environ_of(d.start().status()["server"]["pid"])
    assert env["PROMETHEUS_MULTIPROC_DIR"] == str(own)
