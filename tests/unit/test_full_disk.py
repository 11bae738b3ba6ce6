"""A full state disk, on a real tmpfs (issue 27 §6): an ``operations.jsonl`` record cut at
a page boundary had the next record appended onto it (both lost), and every audited
call printed a logging traceback while its record was lost without a word."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_supervisor.store import HISTORY_FILE, Store
from sglang_supervisor_api.audit_file import _NoFollowRotatingHandler


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs of its own (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Take every free byte of ``disk`` (what a file being written has left in its last
    page stays writable, as on any disk); returns the filler to delete."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    with open(filler, "ab", buffering=0) as f, pytest.raises(OSError) as full:
        f.write(b"\0" * 4096)
    assert full.value.errno == errno.ENOSPC
    return filler


def lines_of(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_record_cut_by_a_full_disk_is_not_continued_by_the_next(
    disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(disk)
    store.append_history({"id": "first"})  # its page has ~4000 bytes left
    filler = fill(disk)
    store.append_history({"id": "cut", "detail": "x" * 6000})  # crosses into a new page
    assert "operation cut not recorded" in caplog.text and "is full" in caplog.text
    filler.unlink()
    store.append_history({"id": "after"})
    assert [r["id"] for r in lines_of(disk / HISTORY_FILE)] == ["first", "after"]


def test_a_fragment_left_by_a_crash_stays_alone_on_its_line(tmp_path: Path) -> None:
    store = Store(tmp_path)
    (tmp_path / HISTORY_FILE).write_text('{"id": "first"}\n{"id": "cu')  # died mid-write
    store.append_history({"id": "after"})
    assert (tmp_path / HISTORY_FILE).read_text().splitlines()[-1] == '{"id": "after"}'


def test_audit_records_a_full_disk_loses_are_one_warning_not_a_traceback_each(
    disk: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    handler = _NoFollowRotatingHandler(disk / "audit.log", maxBytes=1 << 20, backupCount=1)
    handler.setFormatter(logging.Formatter("%(message)s"))

    def audited(n: int, size: int = 100) -> None:
        message = json.dumps({"n": n, "pad": "y" * size})
        handler.handle(logging.makeLogRecord({"msg": message, "levelno": logging.INFO}))

    try:
        audited(0)
        filler = fill(disk)
        for n in range(1, 6):
            audited(n, 3000)
        warned = [r.getMessage() for r in caplog.records if r.name == "supervisor"]
        assert len(warned) == 1 and "a record was not written" in warned[0], warned
        assert f"the disk holding {disk / 'audit.log'}" in warned[0]
        assert "Logging error" not in capsys.readouterr().err
        filler.unlink()
        audited(6)
    finally:
        handler.close()
    warned = [r.getMessage() for r in caplog.records if r.name == "supervisor"]
    assert "is written again" in warned[-1], warned
    kept = [r["n"] for r in lines_of(disk / "audit.log")]
    assert kept[0] == 0 and kept[-1] == 6, kept  # every line a whole record
