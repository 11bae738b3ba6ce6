"""The server's log in the daemon's log (``[server] log_to_journal``), and the daemon's own
probes kept out of SGLang's access log by SGLang 0.5.23's
``--uvicorn-access-log-exclude-prefixes`` (a default the levers can override)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from tests.helpers import Daemon, wait_until

SECRET = "sk-live-7d1e0b"
LEVERS = {"model_path": "sim/llama", "tp_size": 4, "mem_fraction_static": 0.85}
PROBES = ("/health_generate", "/server_info", "/get_server_info", "/metrics")


def access_lines(text: str) -> list[str]:
    """uvicorn's access lines: ``INFO:     127.0.0.1:5432 - "GET /path HTTP/1.1" 200 OK``."""
    return re.findall(r'"(?:GET|POST|HEAD) (\S+) HTTP/1\.[01]"', text)


def client_request(d: Daemon) -> None:
    r = httpx.get(
        f"http://127.0.0.1:{d.server_port}/v1/models",
        headers={"Authorization": f"Bearer {SECRET}"},
        trust_env=False,
    )
    assert r.status_code == 200, r.text


def test_the_server_log_reaches_the_daemon_log_redacted_without_the_probes(
    daemon_factory: type[Daemon],
) -> None:
    d = daemon_factory(
        levers={**LEVERS, "api_key": SECRET}, extra={"server": {"log_to_journal": True}}
    )
    d.start()
    server_log = Path(d.status()["server"]["log_path"])
    client_request(d)
    # The daemon has probed all along (readiness, then liveness every 0.3 s and telemetry).
    forwarded = wait_until(
        lambda: [
            line
            for line in d.log_path.read_text().splitlines()
            if re.search(r"sglang: \[pid \d+\] .*GET /v1/models", line)
        ],
        20,
        0.05,
        "the client's access line forwarded into the daemon's log",
    )
    assert len(forwarded) == 1, forwarded
    daemon_log = d.log_path.read_text()
    pid = d.status()["server"]["pid"]
    # Every kind of server line is there, with the server's pid: its arguments, its start.
    assert f"sglang: [pid {pid}] " in daemon_log
    assert re.search(rf"sglang: \[pid {pid}\] .*server_args=\{{", daemon_log)
    # The secret the server printed (its arguments) is not.
    assert SECRET in server_log.read_text()  # the server's own file has it, as SGLang's does
    assert SECRET not in daemon_log
    assert "'api_key': '<redacted>'" in daemon_log
    # Neither the server's file nor the daemon's log has a probe's access line.
    paths = access_lines(server_log.read_text())
    assert "/v1/models" in paths
    assert not [p for p in paths if p.startswith(PROBES)], paths
    assert not [p for p in access_lines(daemon_log) if p.startswith(PROBES)]
    # The server's last lines (its shutdown) are forwarded before the daemon exits.
    assert d.stop() == 0
    assert re.search(rf"sglang: \[pid {pid}\] .*shutting down", d.log_path.read_text())


def test_the_operator_can_log_every_request_again(daemon_factory: type[Daemon]) -> None:
    # An empty list: SGLang's filter is off, the probes are logged as any request is.
    d = daemon_factory(levers={**LEVERS, "uvicorn_access_log_exclude_prefixes": []}).start()
    server_log = Path(d.status()["server"]["log_path"])
    wait_until(
        lambda: "/health_generate" in access_lines(server_log.read_text()),
        20,
        0.05,
        "a /health_generate access line in the server's log",
    )
    # Without log_to_journal the daemon's log has none of the server's lines.
    assert not re.search(r"sglang: \[pid \d+\]", d.log_path.read_text())
