"""Bounded resources and honest answers, through one real ``serve --simulate`` daemon over
HTTP (issue 27 §6): ``GET /logs`` and a link planted in ``<state>/logs/``, a duplicate
JSON key, ``POST /plan`` on a huge or deeply nested ``config.json``, and many
connections holding their bodies. Each answer is a clear 4xx (or the real log), and the
server's pid, state and levers are unchanged."""

from __future__ import annotations

import functools
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Daemon, wait_until

CAP = 12
BODY_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(
        tmp_path_factory.mktemp("bounded"),
        gpus=2,
        extra={"api": {"max_connections": CAP, "body_timeout_s": BODY_TIMEOUT_S}},
    ).start()
    yield d
    assert d.stop() == 0, d.log()
    d.client.close()


def _unchanged(d: Daemon, before: dict[str, Any]) -> None:
    after = d.status()
    assert after["server"]["pid"] == before["server"]["pid"], "the server was restarted"
    assert after["state"] == "ready" and after["operation"] is None
    assert after["levers"] == before["levers"]


def test_logs_never_follow_a_link_planted_in_the_logs_dir(daemon: Daemon, tmp_path: Path) -> None:
    """A link named as the newest launch's log (``server-9...`` sorts after every real
    one) made ``GET /logs`` serve the file it points to — as root, any file."""
    victim = tmp_path / "shadow"
    victim.write_text("root:$6$secret-hash:19000:0:99999:7:::\n")
    logs = Path(daemon.status()["server"]["log_path"]).parent
    planted = [logs / "server-99999999-000000.000000-planted.log", logs / "server-0.log"]
    for link in planted:
        link.symlink_to(victim)
    try:
        for launch in (0, 1):
            r = daemon.client.get("/logs", params={"launch": launch, "tail": 100})
            assert "secret-hash" not in r.text, (launch, r.text)
        newest = daemon.client.get("/logs", params={"tail": 1000})
        assert newest.status_code == 200 and "server_args=" in newest.text
        assert newest.headers["x-log-path"] == daemon.status()["server"]["log_path"]
    finally:
        for link in planted:
            link.unlink()


@pytest.mark.parametrize(
    ("path", "body", "key"),
    [
        ("/reconcile", b'{"dry_run": true, "dry_run": false}', "dry_run"),
        ("/levers", b'{"levers": {"tp_size": 2, "tp_size": 1}, "dry_run": true}', "tp_size"),
    ],
    ids=["reconcile_dry_run", "nested_lever"],
)
def test_a_repeated_json_key_is_refused_and_nothing_runs(
    daemon: Daemon, path: str, body: bytes, key: str
) -> None:
    """``{"dry_run": true, "dry_run": false}`` made a /reconcile dry run a real one (the
    parser kept the last): refused, naming the key; no operation is even recorded."""
    before = daemon.status()
    ops = daemon.client.get("/operations").json()["operations"]
    r = daemon.client.post(path, params={"wait": "true"}, content=body)
    assert r.status_code == 422, r.text
    (problem,) = r.json()["detail"]["problems"]
    assert problem["type"] == "duplicate_key" and problem["lever"] == "body"
    assert f"the key {key!r} more than once" in problem["message"], problem
    assert daemon.client.get("/operations").json()["operations"] == ops
    _unchanged(daemon, before)


def _held(port: int, n: int) -> list[socket.socket]:
    """``n`` connections, each sending a POST /plan with half of a 1 MiB body, then
    nothing more (as the 400 read-token connections of the issue did)."""
    held = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(
            b"POST /plan HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1048576\r\n\r\n" + b" " * (512 * 1024)
        )
        held.append(s)
    return held


def _answer(s: socket.socket) -> bytes:
    data = b""
    while b"\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n", 1)[0]


def test_connections_are_capped_and_a_body_that_never_ends_is_dropped(daemon: Daemon) -> None:
    """400 connections each holding a 1 MiB body took the daemon to 482 MB, never
    returned. Beyond [api] max_connections a request is answered 503; a body not all
    there within [api] body_timeout_s is a 408 and its connection closed; then the API
    answers as before."""
    before = daemon.status()
    held = _held(daemon.port, CAP + 4)
    try:
        answers = [_answer(s) for s in held]  # each answer comes (a 408 within the bound)
    finally:
        for s in held:
            s.close()
    assert answers.count(b"HTTP/1.1 408 Request Timeout") >= 1, answers
    assert b"HTTP/1.1 503 Service Unavailable" in answers, answers
    assert set(answers) <= {b"HTTP/1.1 408 Request Timeout", b"HTTP/1.1 503 Service Unavailable"}
    wait_until(
        lambda: daemon.client.get("/healthz", timeout=5).status_code == 200,
        10,
        0.1,
        "the API answering once the connections are gone",
    )
    _unchanged(daemon, before)


def test_connections_that_never_send_a_request_do_not_hold_the_cap(daemon: Daemon) -> None:
    """With the cap, sockets that open and send nothing (or trickle their headers) would
    hold every slot and the API answer 503 to everyone: they are closed once
    [api] body_timeout_s has passed without a request."""
    idle = [socket.create_connection(("127.0.0.1", daemon.port), timeout=30) for _ in range(CAP)]
    try:
        idle[0].sendall(b"GET /status HTTP/1.1\r\nHo")  # headers trickling in
        closed = [s.recv(4096) for s in idle]  # b"": the daemon closed it
    finally:
        for s in idle:
            s.close()
    assert closed == [b""] * CAP
    assert daemon.client.get("/healthz", timeout=5).status_code == 200


LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (json.dumps({**LLAMA, "pad": "x" * (5 << 20)}), "is larger than 4194304 bytes"),
        ("[" * 100_000 + "]" * 100_000, "nests deeper than 64 levels"),
        (json.dumps({**LLAMA, "deep": functools.reduce(lambda a, _: [a], range(80), 0)}), "nests"),
    ],
    ids=["5MiB", "nested_100000", "nested_80"],
)
def test_plan_bounds_the_config_json_it_reads(
    daemon: Daemon, tmp_path: Path, config: str, why: str
) -> None:
    """POST /plan reads the config.json of any directory it is given, as the daemon's
    user: a 300 MB one, 14 requests at once, took the daemon to 2.4 GB; a deeply nested
    one was a bare 500. Now each is a 422 naming the file and the bound."""
    (tmp_path / "config.json").write_text(config)
    r = daemon.client.post("/plan", json={"model": str(tmp_path)})
    assert r.status_code == 422, r.text[:2000]
    assert f"{tmp_path / 'config.json'} {why}"[:60] in r.json()["detail"]["message"], r.text
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))  # the bounds are bounds
    assert daemon.client.post("/plan", json={"model": str(tmp_path)}).status_code == 200
