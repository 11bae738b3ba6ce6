"""Requests meant to hurt, through a real ``serve --simulate`` daemon over HTTP (issue 19
§1, §2, §7): absurd parallel sizes, query parameters the route does not read, loose
booleans, bodies that do not parse, forged Host / Origin / Content-Type. Each answer is a
clear 4xx in the documented shape, and the server's pid, state and levers are unchanged.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest

from tests.helpers import Daemon, wait_until


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("hostile"), gpus=4).start()
    yield d
    assert d.stop() == 0, d.log()
    d.client.close()


@pytest.fixture(scope="module")
def forged_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon of its own for the forged requests: each must be in the audit log, and
    refused records are rate-limited (``REFUSED_BURST``), which the module's other
    refusals would otherwise spend."""
    d = Daemon(tmp_path_factory.mktemp("forged"), gpus=4).start()
    yield d
    assert d.stop() == 0, d.log()
    d.client.close()


def _unchanged(d: Daemon, before: dict[str, Any]) -> None:
    after = d.status()
    assert after["server"]["pid"] == before["server"]["pid"], "the server was restarted"
    assert after["state"] == "ready" and after["operation"] is None
    assert after["levers"] == before["levers"] and after["env"] == before["env"]


def _levers(d: Daemon) -> list[str]:
    return [op["kind"] for op in d.client.get("/operations").json()["operations"]]


# ------------------------------------------------------------------ §1 absurd sizes


@pytest.mark.parametrize(
    ("levers", "lever"),
    [
        ({"tp_size": 1_000_000_000_000}, "tp_size"),
        ({"tp_size": 1000, "pp_size": 1000, "dp_size": 1000}, "tp_size"),
        ({"dp_size": 10**15, "gpu_id_step": 10**12}, "dp_size"),
        ({"tp_size": 2, "base_gpu_id": 10**18}, "base_gpu_id"),
    ],
    ids=["tp_1e12", "tp_pp_dp_1000", "dp_1e15", "base_gpu_id_1e18"],
)
def test_absurd_sizes_are_a_quick_422_without_memory_growth(
    daemon: Daemon, levers: dict[str, Any], lever: str
) -> None:
    """Before: the daemon enumerated one GPU id per rank (23 GB RSS, OOM-killed)."""
    before = daemon.status()
    assert daemon.proc is not None
    proc = psutil.Process(daemon.proc.pid)
    rss = proc.memory_info().rss
    for dry_run in (True, False):
        started = time.monotonic()
        r = daemon.apply(levers, dry_run=dry_run)
        elapsed = time.monotonic() - started
        assert r.status_code == 422, r.text[:500]
        problems = r.json()["detail"]["problems"]
        assert lever in [p["lever"] for p in problems], problems
        assert elapsed < 2.0, f"{elapsed:.1f} s for a refusal"
    grown = proc.memory_info().rss - rss
    assert grown < 64 << 20, f"the daemon's RSS grew by {grown >> 20} MiB"
    _unchanged(daemon, before)


# ------------------------------------------------------------------ §2 query and body


def test_query_dry_run_is_a_dry_run(daemon: Daemon) -> None:
    """Before: ?dry_run=true was ignored and the server restarted with the levers."""
    before = daemon.status()
    r = daemon.client.post(
        "/levers",
        params={"dry_run": "true", "wait": "true"},
        json={"levers": {"mem_fraction_static": 0.8}},
    )
    assert r.status_code == 200, r.text
    op = r.json()["operation"]
    assert op["dry_run"] is True and op["state"] == "succeeded", op
    _unchanged(daemon, before)


def test_query_and_body_dry_run_must_agree(daemon: Daemon) -> None:
    before = daemon.status()
    r = daemon.client.post(
        "/levers",
        params={"dry_run": "false"},
        json={"levers": {"mem_fraction_static": 0.8}, "dry_run": True},
    )
    assert r.status_code == 422, r.text
    assert [p["lever"] for p in r.json()["detail"]["problems"]] == ["query.dry_run"]
    assert "contradicts" in r.text
    _unchanged(daemon, before)


@pytest.mark.parametrize(
    ("method", "path", "param"),
    [
        ("POST", "/restart", "dry_run"),
        ("POST", "/stop", "force"),
        ("POST", "/levers", "dryrun"),
        ("GET", "/status", "verbose"),
        ("GET", "/healthz", "x"),
        ("GET", "/operations", "limt"),
        ("GET", "/levers/schema", "query"),
    ],
)
def test_unknown_query_parameter_is_refused_on_every_route(
    daemon: Daemon, method: str, path: str, param: str
) -> None:
    """Before: ``POST /restart?dry_run=true`` restarted the server."""
    before = daemon.status()
    body = {"levers": {"mem_fraction_static": 0.8}} if path == "/levers" else None
    r = daemon.client.request(
        method,
        path,
        params={param: "true", "wait": "true"} if method == "POST" else {param: 1},
        json=body,
    )
    assert r.status_code == 422, (path, r.status_code, r.text[:300])
    problems = r.json()["detail"]["problems"]
    assert [p["lever"] for p in problems] == [f"query.{param}"], problems
    assert "unknown query parameter" in problems[0]["message"]
    _unchanged(daemon, before)


@pytest.mark.parametrize(
    ("field", "value"),
    [("replace", "yes"), ("dry_run", 1), ("dry_run", "true"), ("replace", 0)],
)
def test_booleans_are_strict(daemon: Daemon, field: str, value: Any) -> None:
    """Before: "yes" and 1 were read as true (a "dry_run": 1 that meant "no" applied)."""
    before = daemon.status()
    r = daemon.client.post("/levers", json={"levers": {"mem_fraction_static": 0.8}, field: value})
    assert r.status_code == 422, r.text
    assert field in [p["lever"] for p in r.json()["detail"]["problems"]]
    _unchanged(daemon, before)


def _raw(d: Daemon, head: str, body: bytes) -> tuple[int, dict[str, Any]]:
    """One HTTP/1.1 request over a plain socket (chunked bodies, bytes httpx won't send)."""
    with socket.create_connection(("127.0.0.1", d.port), timeout=30) as s:
        s.sendall(head.encode() + body)
        data = b""
        while b"\r\n\r\n" not in data or not _complete(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1])
    payload = data.split(b"\r\n\r\n", 1)[1]
    return status, json.loads(payload)


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def _post_head(d: Daemon, extra: str) -> str:
    return (
        f"POST /levers HTTP/1.1\r\nHost: 127.0.0.1:{d.port}\r\n"
        f"Content-Type: application/json\r\nConnection: close\r\n{extra}\r\n"
    )


@pytest.mark.parametrize(
    "body",
    [
        b'{"levers": {"served_model_name": "\xff\xfe"}}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"levers": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5000 + b"}",
    ],
    ids=["invalid_utf8", "nested_100k", "nested_5k_objects"],
)
def test_body_parse_errors_use_the_error_shape(daemon: Daemon, body: bytes) -> None:
    """Before: ``{"detail": "There was an error parsing the body"}`` (a bare string)."""
    before = daemon.status()
    status, answer = _raw(daemon, _post_head(daemon, f"Content-Length: {len(body)}\r\n"), body)
    assert status in (400, 422), (status, answer)
    assert isinstance(answer["detail"], dict) and answer["detail"]["message"], answer
    _unchanged(daemon, before)


def test_chunked_body_over_the_limit_is_413(daemon: Daemon) -> None:
    """Before: a 400 "There was an error parsing the body" (only Content-Length was 413)."""
    before = daemon.status()
    chunk = b'{"levers": {"served_model_name": "' + b"x" * (1 << 20) + b'"}}'
    body = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n0\r\n\r\n"
    status, answer = _raw(daemon, _post_head(daemon, "Transfer-Encoding: chunked\r\n"), body)
    assert status == 413, (status, answer)
    assert "max_request_bytes" in answer["detail"]["message"], answer
    _unchanged(daemon, before)


# ------------------------------------------------------------------ §7 forged requests


@pytest.mark.parametrize(
    ("headers", "status", "text"),
    [
        # DNS rebinding: the page's own name, pointed at 127.0.0.1.
        ({"Host": "evil.example"}, 421, "DNS rebinding"),
        ({"Host": "evil.example:{port}"}, 421, "allowed_hosts"),
        # Loopback, but not the port this daemon listens on.
        ({"Host": "localhost:1"}, 421, "does not name this daemon"),
        # A page on another origin (another loopback port), with the right content type.
        ({"Origin": "http://127.0.0.1:1", "Content-Type": "application/json"}, 403, "origin"),
        ({"Origin": "null", "Content-Type": "application/json"}, 403, "origin"),
        # What a no-cors fetch or a form can send without a preflight.
        ({"Content-Type": "text/plain"}, 415, "Content-Type: application/json"),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "curl"),
        ({}, 415, "Content-Type: application/json"),
    ],
    ids=[
        "host_evil",
        "host_evil_port",
        "host_other_port",
        "origin_other_port",
        "origin_null",
        "text_plain",
        "form",
        "no_content_type",
    ],
)
def test_forged_browser_requests_cannot_restart(
    forged_daemon: Daemon, headers: dict[str, str], status: int, text: str
) -> None:
    """Before: each of these restarted the server (the audit log: restart accepted)."""
    daemon = forged_daemon
    before = daemon.status()
    sent = {k: v.format(port=daemon.port) for k, v in headers.items()}
    with httpx.Client(base_url=daemon.url, timeout=30, trust_env=False) as bare:
        r = bare.post("/restart", params={"wait": "true"}, headers=sent)
    assert r.status_code == status, r.text
    assert text.lower() in r.json()["detail"]["message"].lower(), r.text
    _unchanged(daemon, before)
    # The audit file is written by a thread of its own: the record lands shortly after.
    wanted = r.json()["detail"]["message"][:60]
    log = daemon.dir / "state" / "audit.log"
    wait_until(
        lambda: wanted in log.read_text().replace('\\"', '"'),
        10,
        what=f"{wanted!r} in the audit log; its tail: {log.read_text()[-2000:]}",
    )


def test_dns_rebinding_cannot_read_either(daemon: Daemon) -> None:
    r = httpx.get(
        f"{daemon.url}/status", headers={"Host": "evil.example"}, timeout=30, trust_env=False
    )
    assert r.status_code == 421, r.text
    assert "levers" not in r.text


@pytest.mark.parametrize("host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "[::1]"])
def test_loopback_names_and_same_origin_still_work(daemon: Daemon, host: str) -> None:
    h = host.format(port=daemon.port)
    r = daemon.client.get("/status", headers={"Host": h})
    assert r.status_code == 200, r.text
    origin = f"http://{h}"
    r = daemon.client.post(
        "/levers", headers={"Host": h, "Origin": origin}, json={"levers": {}, "dry_run": True}
    )
    assert r.status_code in (200, 202), r.text
    wait_until(lambda: daemon.status()["operation"] is None, 30, 0.05, "the dry run to end")
