"""What the daemon writes to disk stays bounded: the operation history rotates, and a flood
of refused calls cannot push the real records out of the audit log."""

from __future__ import annotations

import json
import logging
import logging.handlers
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_supervisor.store import HISTORY_BACKUPS, HISTORY_FILE, HISTORY_MAX_BYTES, Store
from sglang_supervisor_api import audit as audit_module
from sglang_supervisor_api.audit import MAX_RECORD_CHARS, MAX_VALUE_CHARS, audit

MiB = 1 << 20


def test_operation_history_is_rotated_and_bounded(tmp_path: Path) -> None:
    store = Store(tmp_path)
    big = "x" * MiB
    count = HISTORY_MAX_BYTES // MiB * (HISTORY_BACKUPS + 2)
    for i in range(count):
        store.append_history({"id": f"op{i}", "state": "succeeded", "levers": {"v": big}})
    files = sorted(tmp_path.glob(f"{HISTORY_FILE}*"))
    assert [f.name for f in files] == [HISTORY_FILE] + [
        f"{HISTORY_FILE}.{n}" for n in range(1, HISTORY_BACKUPS + 1)
    ]
    for f in files:
        assert f.stat().st_size <= HISTORY_MAX_BYTES
    # The newest record is in the current file, the oldest ones are gone.
    newest = json.loads((tmp_path / HISTORY_FILE).read_text().splitlines()[-1])
    assert newest["id"] == f"op{count - 1}"
    kept = [json.loads(x)["id"] for f in files for x in f.read_text().splitlines()]
    assert "op0" not in kept


@pytest.fixture
def audit_file(tmp_path: Path) -> Iterator[Path]:
    """The audit logger writing to a small rotating file, as the daemon's does."""
    path = tmp_path / "audit.log"
    handler = logging.handlers.RotatingFileHandler(path, maxBytes=256 * 1024, backupCount=1)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("supervisor.audit")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    rate = audit_module._refused
    audit_module._refused = audit_module._RefusedRate(
        audit_module.REFUSED_BURST, audit_module.REFUSED_EVERY_S
    )
    try:
        yield path
    finally:
        audit_module._refused = rate
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        handler.close()


def records(path: Path) -> list[dict[str, object]]:
    files = [path.with_name(path.name + ".1"), path]
    return [json.loads(x) for f in files if f.exists() for x in f.read_text().splitlines()]


def scope(host: str = "127.0.0.1", port: int = 50000, path: str = "/levers") -> dict[str, object]:
    return {"type": "http", "method": "POST", "path": path, "client": (host, port)}


def test_a_flood_of_refused_calls_keeps_the_real_records(audit_file: Path) -> None:
    audit(scope(), "apply", outcome="accepted", operation="op1", diff={"tp_size": {"new": 8}})
    huge = "y" * 100_000
    for i in range(1100):
        audit(
            scope(port=40000 + i),
            "apply",
            outcome="refused",
            diff={"served_model_name": {"old": None, "new": huge}},
            problems=[{"lever": "served_model_name", "message": huge}],
        )
        audit(scope(port=40000 + i, path="/stop"), "refused", reason="missing bearer token")
    audit(scope(), "stop", outcome="accepted", operation="op2")
    lines = records(audit_file)
    accepted = [x["operation"] for x in lines if x.get("outcome") == "accepted"]
    assert accepted == ["op1", "op2"]
    assert all(len(json.dumps(x)) <= MAX_RECORD_CHARS for x in lines)
    refused = [x for x in lines if x.get("outcome") == "refused" or x["action"] == "refused"]
    assert 0 < len(refused) <= audit_module.REFUSED_BURST
    diff = refused[0]["diff"]
    assert isinstance(diff, dict)
    assert diff["served_model_name"]["new"].endswith("... (100000 characters)")
    assert len(diff["served_model_name"]["new"]) < MAX_VALUE_CHARS + 40
    suppressed = [x for x in lines if x["action"] == "suppressed"]
    assert sum(int(str(x["refused_not_recorded"])) for x in suppressed) == 2200 - len(refused)
    assert suppressed[0]["clients"] == {"127.0.0.1": 2200 - len(refused)}
