"""``serve --log-format json``: every line of the daemon's output is one JSON object —
uvicorn's too — and a rolled-back apply ends with one WARNING line naming the reason."""

from __future__ import annotations

import json

from tests.helpers import Daemon, wait_until


def test_json_log_with_one_line_per_operation_end(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory()
    d.args = ["--log-format", "json"]
    d.start()
    op = d.apply({"mem_fraction_static": 0.99}).json()["operation"]  # OOM at start
    assert op["state"] == "rolled_back", op

    def records() -> list[dict[str, object]]:
        return [json.loads(line) for line in d.log_path.read_text().splitlines() if line]

    ends = wait_until(
        lambda: [r for r in records() if r.get("operation_id") == op["id"] and "outcome" in r],
        10,
        0.05,
        "the operation's end line",
    )
    assert len(ends) == 1
    assert ends[0]["level"] == "WARNING" and ends[0]["outcome"] == "rolled_back"
    assert str(op["rollback_reason"])[:40] in str(ends[0]["message"])
    assert any(str(r["logger"]).startswith("uvicorn") for r in records())

    # Every line logged while it ran says so (issue 27 §8): its id, kind, phase and state.
    during = [r for r in records() if r.get("operation_id") == op["id"] and "outcome" not in r]
    started = [r for r in during if str(r["message"]).startswith("stopped -> starting")]
    assert started and all(r["kind"] == "apply" and r["state"] == "running" for r in during)
    assert [r["phase"] for r in started] == ["start", "rollback_start"], started
    assert not [r for r in records() if "operation_id" in r and r["logger"] == "uvicorn.error"]
    # The daemon's own start operation too (no request behind it: its task says so).
    first = next(r for r in records() if " -> starting (" in str(r["message"]))
    assert first["kind"] == "start" and first["phase"] == "start", first
    assert f"(start {first['operation_id']}:" in str(first["message"])
