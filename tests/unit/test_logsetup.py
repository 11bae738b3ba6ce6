"""The daemon's log lines: JSON with the operation's fields, journald priorities, one
line per operation end at the level its outcome deserves."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
from pathlib import Path

import pytest

from sglang_supervisor.observe.oplog import bind_operation, log_operation_end
from sglang_supervisor.operations import FAILED, ROLLED_BACK, SUCCEEDED, Operation
from sglang_supervisor_api.logsetup import setup_logging


@pytest.fixture(autouse=True)
def restore_root() -> object:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield None
    root.handlers[:] = handlers
    root.setLevel(level)


def ended(state: str, **kw: object) -> Operation:
    op = Operation(kind="apply", **kw)  # type: ignore[arg-type]
    op.finish(state, kw.get("error") if state != SUCCEEDED else None)  # type: ignore[arg-type]
    return op


def test_json_lines_carry_the_operations_outcome_and_level() -> None:
    out = io.StringIO()
    setup_logging("info", "json", stream=out)
    op = ended(ROLLED_BACK)
    op.rollback_reason = "the server exited during start: CUDA out of memory"
    log_operation_end(op)
    log_operation_end(ended(FAILED, error="rollback failed too: GPU 3 not released"))
    log_operation_end(ended(SUCCEEDED))
    logging.getLogger("uvicorn.error").info(  # uvicorn's, same format, without its colours
        "Uvicorn running", extra={"color_message": "\x1b[1mUvicorn running\x1b[0m"}
    )
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(x["level"], x.get("outcome")) for x in lines] == [
        ("WARNING", "rolled_back"),
        ("ERROR", "failed"),
        ("INFO", "succeeded"),
        ("INFO", None),
    ]
    assert "CUDA out of memory" in lines[0]["message"] and lines[0]["operation_id"] == op.id
    assert "GPU 3 not released" in lines[1]["message"]
    assert lines[3]["logger"] == "uvicorn.error" and lines[3]["message"] == "Uvicorn running"
    assert "color_message" not in lines[3]


def test_json_lines_say_which_operation_phase_and_state_they_were_logged_in() -> None:
    """The operation bound to a task marks its lines, and those of the worker threads it
    starts (asyncio.to_thread copies the context); lines elsewhere carry no operation."""
    out = io.StringIO()
    setup_logging("info", "json", stream=out)
    op = Operation(kind="restart")  # type: ignore[arg-type]

    async def operation() -> None:
        bind_operation(op)
        op.phase("release")
        logging.getLogger("supervisor").info("in the task")
        await asyncio.to_thread(logging.getLogger("supervisor").info, "in its thread")

    async def beside() -> None:
        await asyncio.sleep(0)
        logging.getLogger("supervisor").info("beside it")

    async def both() -> None:
        await asyncio.gather(operation(), beside())

    asyncio.run(both())
    logging.getLogger("supervisor").info("after it")
    lines = {x["message"]: x for x in map(json.loads, out.getvalue().splitlines())}
    for message in ("in the task", "in its thread"):
        line = lines[message]
        assert (line["operation_id"], line["kind"], line["phase"], line["state"]) == (
            op.id,
            "restart",
            "release",
            "running",
        )
    assert "operation_id" not in lines["beside it"] and "operation_id" not in lines["after it"]


def test_journald_priorities_only_on_the_journal_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "journal"
    with open(path, "w") as stream:
        st = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        setup_logging("debug", "text", stream=stream)
        log = logging.getLogger("supervisor")
        log.error("boom")
        log.warning("careful")
        log.info("fine")
        log.debug("detail\nsecond line")
    assert path.read_text().splitlines() == [
        "<3>ERROR supervisor: boom",
        "<4>WARNING supervisor: careful",
        "<6>INFO supervisor: fine",
        "<7>DEBUG supervisor: detail",
        "<7>second line",
    ]
    # Another stream under the same $JOURNAL_STREAM (stderr redirected): no prefixes.
    other = io.StringIO()
    setup_logging("info", "text", stream=other)
    logging.getLogger("supervisor").warning("careful")
    assert " WARNING supervisor: careful" in other.getvalue()
    assert not other.getvalue().startswith("<")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_every_line_of_the_daemons_log_is_redacted(fmt: str) -> None:
    """A reason that quotes the server's log or a command line reaches the journal through
    the same rule as every answer (issue 27 §1): an operation's end line, a traceback."""
    out = io.StringIO()
    setup_logging("info", fmt, stream=out)
    op = ended(ROLLED_BACK)
    op.rollback_reason = "exited 1; last line: server_args={'api_key': 'k1', 'port': 1}"
    log_operation_end(op)
    try:
        raise RuntimeError("python -m sglang.launch_server --api-key k2 failed")
    except RuntimeError:
        logging.getLogger("supervisor").exception("spawn of %s", "--admin-api-key=k3")
    text = out.getvalue()
    for secret in ("'k1'", "k2 ", "=k3"):
        assert secret not in text, text
    assert text.count("<redacted>") >= 3 and "'port': 1" in text, text
