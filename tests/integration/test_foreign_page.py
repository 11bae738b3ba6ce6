"""A web page from another origin, in the real headless Chromium the status-page tests
use, tries to drive a loopback daemon that has no token (issue 19 §7): before, a no-cors
``fetch(".../restart", {method: "POST"})`` restarted the server (the audit log said
``restart accepted``), and a DNS-rebound name read and wrote with same-origin rights.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cdp import Browser, find_chromium
from tests.helpers import Daemon, free_port, wait_until

CHROMIUM = find_chromium()
if CHROMIUM is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("CI: chromium is missing (scripts/test.sh installs it as root)")
    pytest.skip("needs Debian's chromium (scripts/test.sh installs it)", allow_module_level=True)

#: What an attacker's page does: every POST a browser sends without a CORS preflight.
ATTACK = """
async function attack(base) {
  const tries = [
    fetch(base + "/restart?wait=true", {method: "POST", mode: "no-cors"}),
    fetch(base + "/stop", {method: "POST", mode: "no-cors",
                           headers: {"Content-Type": "text/plain"}, body: "{}"}),
    fetch(base + "/levers?wait=true", {method: "POST", mode: "no-cors",
      headers: {"Content-Type": "text/plain"},
      body: JSON.stringify({levers: {mem_fraction_static: 0.5}})}),
    // With the JSON type the browser must ask first (a preflight): refused before it is sent.
    fetch(base + "/restart", {method: "POST", headers: {"Content-Type": "application/json"}}),
  ];
  const out = await Promise.allSettled(tries);
  return out.map(r => r.status);
}
"""


@pytest.fixture
def attacker_site(tmp_path: Path) -> Iterator[str]:
    """A tiny http.server on another loopback port: a foreign origin."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(f"<html><body>cats<script>{ATTACK}</script></body></html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _audit(d: Daemon) -> list[dict[str, object]]:
    path = d.dir / "state" / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_page_on_another_origin_cannot_restart_the_server(
    daemon_factory: type[Daemon], attacker_site: str
) -> None:
    d = daemon_factory().start()
    before = d.status()
    assert CHROMIUM is not None
    browser = Browser(CHROMIUM)
    try:
        p = browser.page()
        p.goto(attacker_site + "/index.html")
        outcomes = p.js(f"attack({json.dumps(d.url)})")
        assert len(outcomes) == 4, outcomes
    finally:
        browser.close()
    # The three simple requests reached the daemon and were refused there, by origin.
    refused = wait_until(
        lambda: (
            [
                e
                for e in _audit(d)
                if e.get("outcome", e.get("action")) == "refused" and "origin" in str(e)
            ]
            or None
        ),
        15,
        0.05,
        "the refusals in the audit log",
    )
    assert {str(e.get("path")) for e in refused} >= {"/restart", "/stop", "/levers"}, refused
    assert not [e for e in _audit(d) if e.get("outcome") == "accepted"], _audit(d)
    after = d.status()
    assert after["server"]["pid"] == before["server"]["pid"], "the page restarted the server"
    assert after["state"] == "ready" and after["levers"] == before["levers"]
    assert [op["kind"] for op in d.client.get("/operations").json()["operations"]] == ["start"]


def test_a_dns_rebound_name_gets_nothing(daemon_factory: type[Daemon]) -> None:
    """evil.example resolves to 127.0.0.1 (Chromium's host resolver rules stand in for
    the attacker's DNS): its page is same-origin with the daemon's port, so only the Host
    header tells them apart."""
    d = daemon_factory().start()
    before = d.status()
    assert CHROMIUM is not None
    browser = Browser(CHROMIUM, flags=["--host-resolver-rules=MAP evil.example 127.0.0.1"])
    try:
        p = browser.page()
        p.goto(f"http://evil.example:{d.port}/")
        assert "does not name this daemon" in p.text("body")
        answers = p.js(
            "Promise.all(["
            "fetch('/status').then(r => r.status),"
            "fetch('/restart', {method: 'POST', headers: {'Content-Type': 'application/json'}})"
            ".then(r => r.status)])"
        )
        assert answers == [421, 421], answers
    finally:
        browser.close()
    after = d.status()
    assert after["server"]["pid"] == before["server"]["pid"]
    wait_until(
        lambda: any("DNS rebinding" in str(e) for e in _audit(d)), 10, 0.05, "the refusal audited"
    )
