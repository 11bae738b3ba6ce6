"""Every client command maps the daemon's answers to the same message and exit code: the
CLI has one HTTP client (``sglang_supervisor_api.cli.client``) and one place that reports its errors
(``sglang_supervisor_api.cli.runner``). A stand-in daemon (a few lines of ``http.server``) answers
every request with one error."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sglang_supervisor_api.cli.main import main

RUNNING_OP = {
    "id": "op42",
    "kind": "apply",
    "state": "running",
    "phases": [{"name": "start", "state": "running", "duration_s": 3.5}],
}


class StandIn:
    """Answers every request with ``status`` and ``body`` (``GET /operations/op42``: the
    running operation a 409 names)."""

    def __init__(self) -> None:
        self.status = 200
        self.body: Any = {}
        self.requests: list[str] = []
        self.authorization: list[str | None] = []


@pytest.fixture
def daemon() -> Iterator[tuple[str, StandIn]]:
    answer = StandIn()

    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            self.rfile.read(length)
            answer.requests.append(f"{self.command} {self.path}")
            answer.authorization.append(self.headers.get("authorization"))
            status, body = answer.status, answer.body
            if self.path.startswith("/operations/op42"):
                status, body = 200, {"operation": RUNNING_OP}
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _reply

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answer
    finally:
        server.shutdown()
        server.server_close()


def run(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, err.getvalue()


def same_message(text: str) -> str:
    for said in ("GET /status", "POST /plan", "/status", "/plan"):
        text = text.replace(said, "REQUEST")
    return text


@pytest.mark.parametrize(
    ("status", "body", "code", "says"),
    [
        (401, {"detail": {"message": "a bearer token is required"}}, 6, "wants a token"),
        (403, {"detail": "Forbidden"}, 6, "wants a token"),
        (404, {"detail": {"message": "no operation 'op9'"}}, 7, "no operation 'op9'"),
        (404, {"detail": "Not Found"}, 1, "(an older version?)"),
        (500, {"detail": "boom"}, 1, "the daemon failed (500): boom"),
        (
            409,
            {"detail": {"message": "an operation is running", "operation": "op42"}},
            5,
            "busy: apply op42 running, phase start running (3.50s)",
        ),
        (
            422,
            {
                "detail": {
                    "message": "the lever set was refused; nothing was changed",
                    "problems": [{"lever": "tp_size", "message": "must be a power of 2"}],
                }
            },
            2,
            "  tp_size: must be a power of 2",
        ),
    ],
)
def test_status_and_plan_report_an_error_alike(
    daemon: tuple[str, StandIn], status: int, body: Any, code: int, says: str
) -> None:
    url, answer = daemon
    answer.status, answer.body = status, body
    status_code, status_err = run("status", "--url", url)
    plan_code, plan_err = run("plan", "--url", url)
    assert (status_code, plan_code) == (code, code)
    assert says in status_err
    assert same_message(plan_err) == same_message(status_err)


def test_cancel_of_a_rollback_says_it_cannot_be_cancelled(daemon: tuple[str, StandIn]) -> None:
    """Issue 20 §7: the daemon refuses to cancel a rollback (409, the operation still
    running); the CLI prints why instead of "has already ended"."""
    url, answer = daemon
    message = (
        "operation op7 (apply) cannot be cancelled now: the rollback to the last-good "
        "levers has begun (a cancel now would leave nothing serving)"
    )
    answer.status = 409
    answer.body = {"detail": {"message": message, "operation": {"id": "op7", "state": "running"}}}
    code, err = run("cancel", "op7", "--no-wait", "--url", url)
    assert code == 1
    assert f"not cancelled: {message}" in err
    assert "already ended" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ("cancel", "--no-wait", "../stop#"),
        ("cancel", "--no-wait", "../../stop?"),
        ("operations", "show", "../levers#"),
        ("operations", "follow", "../status#"),
    ],
)
def test_an_operation_id_is_never_another_path(
    daemon: tuple[str, StandIn], argv: tuple[str, ...]
) -> None:
    """``cancel '../stop#'`` was POST /stop (the server stopped); ``operations show
    '../levers#'`` printed GET /levers as an operation. A bad id is refused, unsent."""
    url, answer = daemon
    code, err = run(*argv, "--url", url)
    assert code == 2 and "is not an operation id" in err, err
    assert not [r for r in answer.requests if "/stop" in r or "/levers" in r], answer.requests


def test_the_shared_options_also_go_before_the_command(daemon: tuple[str, StandIn]) -> None:
    """``sglang-supervisor --url URL status`` was "unrecognized arguments" (issue 27 §8).
    Before the command they mean what they mean after it; after it wins; one the command
    does not take is refused (exit 2), not dropped."""
    url, answer = daemon
    answer.status, answer.body = 401, {"detail": {"message": "a bearer token is required"}}
    code, err = run("--url", url, "--token", "t0k", "status")
    assert code == 6 and "refused the token" in err, err
    assert answer.requests == ["GET /status"] and answer.authorization == ["Bearer t0k"]

    code, err = run("--url", "http://127.0.0.1:9", "--token", "a", "levers", "--url", url)
    assert code == 6, err  # the --url after the command was asked, not port 9
    assert answer.requests[-1] == "GET /levers" and answer.authorization[-1] == "Bearer a"

    asked = len(answer.requests)
    said = io.StringIO()
    with contextlib.redirect_stderr(said), pytest.raises(SystemExit) as refused:
        main(["--url", url, "rollout", "--daemon", url, "--set", "tp_size=2"])
    assert refused.value.code == 2  # argparse's usage error
    assert "--url is not an option of `sglang-supervisor rollout`" in said.getvalue()
    assert len(answer.requests) == asked  # refused before anything was sent
