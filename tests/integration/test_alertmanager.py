"""deploy/prometheus/alertmanager.example.yml in a real Alertmanager (Debian's
prometheus-alertmanager, installed by scripts/check-deploy.sh): one cause on one host is
one page — the consequences are inhibited, not sent.

The alert rules already exclude each other where they can (alerts_test.yml); here the
rules' output is assumed to overlap anyway (the seconds where both are true, or a rule
added later) and the inhibitions must hold the consequences back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "prometheus" / "alertmanager.example.yml"
BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")

if BINARY is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI: alertmanager missing (scripts/check-deploy.sh installs it)")
    pytest.skip("needs prometheus-alertmanager", allow_module_level=True)


class Receiver:
    """The webhook end of the example's receivers: records every notification."""

    def __init__(self) -> None:
        self.notifications: list[tuple[str, dict[str, Any]]] = []
        received = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def pages(self) -> list[list[str]]:
        """Alert names of each notification to the pager."""
        return [
            sorted(a["labels"]["alertname"] for a in body["alerts"] if a["status"] == "firing")
            for path, body in self.notifications
            if path == "/pager"
        ]


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[tuple[httpx.Client, Receiver]]:
    receiver = Receiver()
    config = EXAMPLE.read_text().replace("http://127.0.0.1:9099", receiver.url)
    # The example waits 30 s to group; a test need not.
    config = config.replace("group_wait: 30s", "group_wait: 1s")
    assert receiver.url in config
    (tmp_path / "am.yml").write_text(config)
    port = free_port()
    proc = subprocess.Popen(
        [
            str(BINARY),
            f"--config.file={tmp_path / 'am.yml'}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10, trust_env=False)

    def ready() -> bool:
        assert proc.poll() is None, "alertmanager exited"
        try:
            return client.get("/-/ready").status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, 30, 0.1, "alertmanager to be ready")
        yield client, receiver
    finally:
        proc.terminate()
        proc.wait(10)
        client.close()
        receiver.server.shutdown()


def fire(client: httpx.Client, host: str, *alerts: tuple[str, str]) -> None:
    now = datetime.now(UTC)
    body = [
        {
            "labels": {
                "alertname": name,
                "severity": severity,
                "host": host,
                "instance": f"{host}:8470",
                "job": "sglang-supervisor",
            },
            "annotations": {"summary": name},
            "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(minutes=10)).isoformat(),
        }
        for name, severity in alerts
    ]
    assert client.post("/api/v2/alerts", json=body).status_code == 200


def inhibited(client: httpx.Client) -> dict[str, bool]:
    return {
        a["labels"]["alertname"]: bool(a["status"]["inhibitedBy"])
        for a in client.get("/api/v2/alerts").json()
    }


def test_a_failed_release_pages_once(alertmanager: tuple[httpx.Client, Receiver]) -> None:
    client, receiver = alertmanager
    # What three rules would say about one release that did not finish.
    fire(
        client,
        "gpu-node-01",
        ("SglangServerFailed", "critical"),
        ("SglangServerDown", "critical"),
        ("SglangGpuMemoryNotReleased", "critical"),
    )
    wait_until(lambda: receiver.pages(), 30, 0.1, "the page")
    assert receiver.pages() == [["SglangServerFailed"]]
    assert inhibited(client) == {
        "SglangServerFailed": False,
        "SglangServerDown": True,
        "SglangGpuMemoryNotReleased": True,
    }


def test_a_kv_bound_server_pages_once_and_its_warnings_wait(
    alertmanager: tuple[httpx.Client, Receiver],
) -> None:
    client, receiver = alertmanager
    fire(
        client,
        "gpu-node-02",
        ("SglangKvCacheExhausted", "critical"),
        ("SglangKvCacheNearlyFull", "warning"),
        ("SglangQueueDepthHigh", "warning"),
        ("SglangTimeToFirstTokenHigh", "warning"),
    )
    wait_until(lambda: receiver.pages(), 30, 0.1, "the page")
    assert receiver.pages() == [["SglangKvCacheExhausted"]]
    state = inhibited(client)
    assert state.pop("SglangKvCacheExhausted") is False
    assert all(state.values()), state
    # Inhibition is per host: the same warning on another host is not held back.
    fire(client, "gpu-node-03", ("SglangQueueDepthHigh", "warning"))
    wait_until(
        lambda: any(
            a["labels"]["host"] == "gpu-node-03" and not a["status"]["inhibitedBy"]
            for a in client.get("/api/v2/alerts").json()
        ),
        10,
        0.1,
        "the other host's warning, not inhibited",
    )
