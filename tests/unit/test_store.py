"""The state directory: atomic saves, a previous copy, damage detected and reported.

What an operator must be able to count on: after any crash, disk-full or corruption, a
restarted daemon starts the last good levers it knows, and says when it had to fall back.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.store import (
    PREV_FILE,
    STATE_FILE,
    PersistedState,
    RecordedServer,
    Store,
    StoreError,
)

GOOD = LeverSet({"tp_size": 8, "mem_fraction_static": 0.85}, {"NCCL_DEBUG": "INFO"})
NEWER = LeverSet({"tp_size": 8, "mem_fraction_static": 0.9, "kv_cache_dtype": "fp8_e4m3"}, {})


def state(levers: LeverSet, last_good: LeverSet | None = None) -> PersistedState:
    return PersistedState(levers=levers, last_good=last_good or levers)


def test_save_load_round_trip(tmp_path: Path) -> None:
    saved = PersistedState(
        levers=NEWER,
        last_good=GOOD,
        server=RecordedServer(4242, 1700000000.25, "inst.abc123", "/tmp/x.log", NEWER.to_json()),
        pending_operation={"id": "op1", "kind": "apply", "levers": NEWER.to_json()},
    )
    Store(tmp_path).save(saved)
    loaded = Store(tmp_path).load()  # a new Store: what a restarted daemon sees
    assert loaded.levers == NEWER
    assert loaded.last_good == GOOD
    assert loaded.server == saved.server
    assert loaded.pending_operation == saved.pending_operation
    assert loaded.load_warning is None


def test_empty_state_dir_loads_empty_without_warning(tmp_path: Path) -> None:
    loaded = Store(tmp_path / "new").load()
    assert loaded.levers is None
    assert loaded.last_good is None
    assert loaded.load_warning is None


def test_the_previous_copy_is_kept(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.save(state(GOOD))
    store.save(state(NEWER))
    assert Store(tmp_path).load().levers == NEWER
    (tmp_path / STATE_FILE).unlink()
    assert Store(tmp_path).load().levers == GOOD


def test_no_temporary_file_is_left_behind(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.save(state(GOOD))
    store.save(state(NEWER))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([PREV_FILE, STATE_FILE])


def _truncate(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: len(text) // 2])


def _flip_a_value(path: Path) -> None:
    """Valid JSON whose content no longer matches its checksum (a bit flip on disk)."""
    raw = json.loads(path.read_text())
    raw["data"]["levers"]["levers"]["mem_fraction_static"] = 0.99
    path.write_text(json.dumps(raw))


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x00\xff\xfe not json at all")


@pytest.mark.parametrize("damage", [_truncate, _flip_a_value, _garbage], ids=lambda f: f.__name__)
def test_damaged_state_falls_back_to_the_previous_copy(tmp_path: Path, damage: Any) -> None:
    store = Store(tmp_path)
    store.save(state(GOOD))
    store.save(state(NEWER))
    damage(tmp_path / STATE_FILE)
    loaded = Store(tmp_path).load()
    assert loaded.levers == GOOD
    assert loaded.last_good == GOOD
    warning = loaded.load_warning
    assert warning is not None
    assert f"{tmp_path / STATE_FILE} is damaged" in warning
    assert f"using {tmp_path / PREV_FILE}" in warning


def _resigned(change: Any) -> Any:
    """A file whose checksum is valid but whose content has the wrong shape."""

    def damage(path: Path) -> None:
        raw = json.loads(path.read_text())
        change(raw["data"])
        body = json.dumps(raw["data"], sort_keys=True, separators=(",", ":"))
        raw["sha256"] = hashlib.sha256(body.encode()).hexdigest()
        path.write_text(json.dumps(raw))

    return damage


WRONG_SHAPES = {
    "levers_a_number": lambda d: d.update(levers=5),
    "levers_a_list": lambda d: d.update(last_good={"levers": [1, 2], "env": {}}),
    "env_not_strings": lambda d: d.update(levers={"levers": {}, "env": {"A": 1}}),
    "server_missing_fields": lambda d: d.update(server={"pid": 1}),
    "server_pid_a_string": lambda d: d.update(
        server={"pid": "1", "create_time": 1.0, "tag": "t", "log_path": "l", "levers": {}}
    ),
    "baseline_a_list": lambda d: d.update(baseline=[1, 2]),
    "pending_a_string": lambda d: d.update(pending_operation="apply"),
}


@pytest.mark.parametrize("change", list(WRONG_SHAPES.values()), ids=list(WRONG_SHAPES))
def test_a_valid_checksum_over_the_wrong_shape_falls_back_to_the_previous_copy(
    tmp_path: Path, change: Any
) -> None:
    store = Store(tmp_path)
    store.save(state(GOOD))
    store.save(state(NEWER))
    _resigned(change)(tmp_path / STATE_FILE)
    loaded = Store(tmp_path).load()  # never a traceback
    assert loaded.levers == GOOD
    warning = loaded.load_warning or ""
    assert f"{tmp_path / STATE_FILE} is damaged" in warning
    assert f"using {tmp_path / PREV_FILE}" in warning
    # Saving over it does not make the wrong shape the fallback.
    store.save(state(NEWER))
    (tmp_path / STATE_FILE).unlink()
    assert Store(tmp_path).load().levers == GOOD


def test_checksum_mismatch_is_named(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.save(state(GOOD))
    store.save(state(NEWER))
    _flip_a_value(tmp_path / STATE_FILE)
    warning = Store(tmp_path).load().load_warning
    assert warning is not None
    assert "checksum mismatch" in warning


def test_both_copies_damaged_starts_empty_and_says_so(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.save(state(GOOD))
    store.save(state(NEWER))
    _truncate(tmp_path / STATE_FILE)
    _garbage(tmp_path / PREV_FILE)
    loaded = Store(tmp_path).load()
    assert loaded.levers is None
    assert loaded.last_good is None
    warning = loaded.load_warning
    assert warning is not None
    assert STATE_FILE in warning
    assert PREV_FILE in warning
    assert "starting from the configured levers" in warning


def test_a_damaged_file_never_becomes_the_fallback(tmp_path: Path) -> None:
    """Saving over a damaged state.json must not rotate the damage into state.prev.json."""
    store = Store(tmp_path)
    store.save(state(GOOD))
    store.save(state(GOOD))  # prev = GOOD
    _truncate(tmp_path / STATE_FILE)
    store.save(state(NEWER))
    (tmp_path / STATE_FILE).unlink()
    assert Store(tmp_path).load().levers == GOOD


def _disk_full(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_disk_full_raises_store_error_and_keeps_the_previous_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(tmp_path)
    store.save(state(GOOD))
    monkeypatch.setattr(os, "fsync", _disk_full)
    with pytest.raises(StoreError) as info:
        store.save(state(NEWER))
    message = str(info.value)
    assert "No space left on device" in message
    assert "the previous state is kept" in message
    assert str(tmp_path / STATE_FILE) in message
    monkeypatch.undo()
    loaded = Store(tmp_path).load()
    assert loaded.levers == GOOD
    assert loaded.last_good == GOOD
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_unwritable_state_dir_raises_store_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(tmp_path)
    store.save(state(GOOD))

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr("sglang_supervisor.store.tempfile.mkstemp", refuse)
    with pytest.raises(StoreError, match=r"Permission denied.*the previous state is kept"):
        store.save(state(NEWER))
    monkeypatch.undo()
    assert Store(tmp_path).load().levers == GOOD


def test_a_failed_write_then_a_good_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(tmp_path)
    store.save(state(GOOD))
    monkeypatch.setattr(os, "fsync", _disk_full)
    with pytest.raises(StoreError):
        store.save(state(NEWER))
    monkeypatch.undo()
    store.save(state(NEWER))
    loaded = Store(tmp_path).load()
    assert loaded.levers == NEWER
    assert loaded.load_warning is None


def test_history_is_appended_one_json_line_per_operation(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.append_history({"id": "a", "state": "succeeded"})
    store.append_history({"id": "b", "state": "rolled_back"})
    lines = (tmp_path / "operations.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a", "b"]


def test_a_disk_full_error_names_the_mount_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 20 §4: a full disk names the disk (its mount point), not only the file."""
    from sglang_supervisor.diskspace import mount_point

    store = Store(tmp_path)
    monkeypatch.setattr(os, "fsync", _disk_full)
    with pytest.raises(StoreError) as info:
        store.save(state(GOOD))
    assert f"mounted at {mount_point(tmp_path)}" in str(info.value)
    assert str(tmp_path / STATE_FILE) in str(info.value)


def test_planted_links_are_never_written_through(tmp_path: Path) -> None:
    """Issue 20 §4: the temporary file's name was predictable (``.state.json.<pid>.tmp``)
    and opened following links, so a link planted there made the daemon (root) overwrite
    the file it pointed to. Now neither the temporary name nor the final path, nor
    operations.jsonl, writes through a link."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    state_dir = tmp_path / "state"
    store = Store(state_dir)
    (state_dir / f".{STATE_FILE}.{os.getpid()}.tmp").symlink_to(victim)
    store.save(state(GOOD))
    assert victim.read_text() == "precious\n"
    (state_dir / STATE_FILE).unlink()
    (state_dir / STATE_FILE).symlink_to(victim)
    store.save(state(NEWER))
    assert victim.read_text() == "precious\n"
    assert not (state_dir / STATE_FILE).is_symlink()
    assert Store(state_dir).load().levers == NEWER
    (state_dir / "operations.jsonl").symlink_to(victim)
    store.append_history({"id": "x"})
    assert victim.read_text() == "precious\n"
    made = [p for p in state_dir.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]
    assert made == []


def test_a_link_planted_as_the_daemon_lock_is_refused_not_truncated(tmp_path: Path) -> None:
    """The lock file is truncated and rewritten with the daemon's pid: through a planted
    link, a daemon running as root truncated the file it pointed to."""
    from sglang_supervisor_api.state_lock import LOCK_FILE, lock_state_dir

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / LOCK_FILE).symlink_to(victim)
    with pytest.raises(OSError) as info:
        lock_state_dir(state_dir)
    assert info.value.errno == errno.ELOOP
    assert victim.read_text() == "precious\n"


def test_a_link_planted_as_a_server_log_is_not_written_through(tmp_path: Path) -> None:
    """The server's log is opened O_NOFOLLOW: a link planted under the next log's name
    is refused (the output then goes to the daemon's own log, as for a full disk)."""
    from sglang_supervisor.host.process import spawn

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    log_path = tmp_path / "logs" / "server-1.log"
    log_path.parent.mkdir()
    log_path.symlink_to(victim)
    launch = spawn(["/bin/sh", "-c", "echo from-the-server"], {}, tag="t.1", log_path=log_path)
    assert launch.popen is not None
    launch.popen.wait(10)
    assert victim.read_text() == "precious\n"


def test_rejected_levers_of_an_earlier_upgrade_are_kept_too(tmp_path: Path) -> None:
    from sglang_supervisor.store import REJECTED_FILE

    store = Store(tmp_path)
    first = {"rejected_at": 1.0, "sets": {"state.json last_good": {"levers": {"a": 1}}}}
    again = {"rejected_at": 2.0, "sets": first["sets"]}
    second = {"rejected_at": 3.0, "sets": {"state.json last_good": {"levers": {"b": 2}}}}
    store.keep_rejected(first)
    store.keep_rejected(again)  # the same misfits at the next start: nothing to keep twice
    assert not (tmp_path / "state.rejected.prev.json").exists()
    store.keep_rejected(second)
    assert '"b": 2' in (tmp_path / REJECTED_FILE).read_text()
    assert '"a": 1' in (tmp_path / "state.rejected.prev.json").read_text()
