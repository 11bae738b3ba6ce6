"""Persisted state: current and last-good levers, the recorded server, operation history.

``state.json`` is replaced atomically (temporary file, fsync, rename, fsync of the
directory); the copy it replaced is kept as ``state.prev.json``. Each file carries a
SHA-256 of its content, so a corrupt or truncated file is detected and the previous good
copy is used instead — and the problem is reported, not hidden.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_supervisor.diskspace import describe_os_error
from sglang_supervisor.sglang.levers import LeverSet

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
PREV_FILE = "state.prev.json"
#: Persisted levers that stopped fitting the schema (an SGLang upgrade renamed a flag),
#: kept for the operator instead of being overwritten by the next save.
REJECTED_FILE = "state.rejected.json"
HISTORY_FILE = "operations.jsonl"
#: operations.jsonl is rotated before it grows past this (operations.jsonl.1 is the newest
#: of the ``HISTORY_BACKUPS`` older files): the history stays bounded on disk.
HISTORY_MAX_BYTES = 16 << 20
HISTORY_BACKUPS = 3
FORMAT = 1


class StoreError(RuntimeError):
    """Persisting failed (disk full, permissions); the message says which file and why."""


@dataclass
class RecordedServer:
    """The launcher a daemon started, so a restarted daemon can find it again."""

    pid: int
    create_time: float
    tag: str
    log_path: str
    levers: dict[str, Any]
    #: It answered /health_generate once: at adoption it is judged by the liveness
    #: rules (hung or not), not given a start's whole ready timeout.
    ready: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "create_time": self.create_time,
            "tag": self.tag,
            "log_path": self.log_path,
            "levers": self.levers,
            "ready": self.ready,
        }


@dataclass
class PersistedState:
    levers: LeverSet | None = None
    last_good: LeverSet | None = None
    server: RecordedServer | None = None
    #: An operation the daemon was running when it last wrote (interrupted if still set).
    pending_operation: dict[str, Any] | None = None
    #: What went wrong while loading, for /status (None when the file was fine or absent).
    load_warning: str | None = None
    #: Per-GPU memory used with nothing of ours running (NVML index -> bytes).
    baseline: dict[int, int] | None = None
    #: The operator's stop that left the server stopped (its operation id): a restarted
    #: daemon leaves it stopped until an operator starts it. None once anything launches.
    stopped_by: str | None = None
    #: The server's restarts and the failures within the crash-loop window
    #: (``{"restarts", "by_reason", "recent"}``, recent as unix times): a restarted daemon
    #: goes on counting them (the window would reset with each daemon otherwise).
    crashes: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "levers": None if self.levers is None else self.levers.to_json(),
            "last_good": None if self.last_good is None else self.last_good.to_json(),
            "server": None if self.server is None else self.server.to_json(),
            "pending_operation": self.pending_operation,
            "baseline": None
            if self.baseline is None
            else {str(k): v for k, v in sorted(self.baseline.items())},
            "stopped_by": self.stopped_by,
            "crashes": self.crashes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PersistedState:
        """Raises ``ValueError`` naming the field when ``data`` has the wrong shape (a
        file with a valid checksum written by another version, or by hand)."""
        server = data.get("server")
        pending = data.get("pending_operation")
        baseline = data.get("baseline")
        if pending is not None and not isinstance(pending, dict):
            raise ValueError(f"pending_operation is {type(pending).__name__}, not an object")
        if baseline and not isinstance(baseline, dict):
            raise ValueError(f"baseline is {type(baseline).__name__}, not an object")
        stopped_by = data.get("stopped_by")
        if stopped_by is not None and not isinstance(stopped_by, str):
            raise ValueError(f"stopped_by is {type(stopped_by).__name__}, not a string")
        crashes = data.get("crashes")
        if crashes is not None and not (
            isinstance(crashes, dict)
            and isinstance(crashes.get("restarts"), int)
            and isinstance(crashes.get("by_reason"), dict)
            and isinstance(crashes.get("recent"), list)
        ):
            raise ValueError("crashes is not an object of restarts, by_reason and recent")
        return cls(
            levers=_lever_set(data, "levers"),
            last_good=_lever_set(data, "last_good"),
            server=_recorded_server(server) if server else None,
            pending_operation=pending,
            baseline={int(k): int(v) for k, v in baseline.items()} if baseline else None,
            stopped_by=stopped_by,
            crashes=crashes,
        )


def _lever_set(data: dict[str, Any], key: str) -> LeverSet | None:
    value = data.get(key)
    if not value:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(value.get(part) or {}, dict) for part in ("levers", "env")
    ):
        raise ValueError(f"{key} is not an object of levers and env")
    env = value.get("env") or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError(f"{key}.env has a value that is not a string")
    return LeverSet.from_json(value)


def _recorded_server(value: Any) -> RecordedServer:
    shape: dict[str, type | tuple[type, ...]] = {
        "pid": int,
        "create_time": (int, float),
        "tag": str,
        "log_path": str,
        "levers": dict,
    }
    if not isinstance(value, dict) or set(value) - {"ready"} != set(shape):
        raise ValueError(f"server is not an object with exactly {sorted(shape)} (and ready)")
    for key, kind in shape.items():
        if not isinstance(value[key], kind) or isinstance(value[key], bool):
            raise ValueError(f"server.{key} has the wrong type ({type(value[key]).__name__})")
    if not isinstance(value.get("ready", False), bool):
        raise ValueError("server.ready is not true or false")
    return RecordedServer(**value)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: Flags for every file the daemon creates in the state directory: never through a
#: symbolic link someone planted there (the daemon may run as root).
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader sees the old or the new content, never half.

    The temporary file gets a random name in the same directory and is created
    exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600): a file or symbolic link
    planted under a predictable name is never written through. The rename then replaces
    the directory entry ``path`` itself — a symbolic link there is replaced, never
    followed. Raises ``StoreError`` (the old file intact) when the disk is full or not
    writable; the message names the path and the disk.
    """
    tmp: Path | None = None
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        tmp = Path(name)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        _fsync_dir(path.parent)
    except OSError as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise StoreError(
            f"cannot write {path}: {describe_os_error(path, exc)} — the previous state is "
            "kept; free disk space or fix permissions on the state directory"
        ) from exc


def _append_line(path: Path, data: bytes) -> None:
    """Append ``data`` (one line) to ``path`` whole or not at all (see ``append_history``)."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | _NOFOLLOW, 0o600)
    try:
        start = os.fstat(fd).st_size
        if start and os.pread(fd, 1, start - 1) != b"\n":
            data = b"\n" + data  # a fragment left earlier ends here, alone on its line
        written = 0
        try:
            while written < len(data):
                written += os.write(fd, data[written:])
        except OSError:
            if written:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def _envelope(data: dict[str, Any]) -> str:
    body = json.dumps(data, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(body.encode()).hexdigest()
    return json.dumps({"format": FORMAT, "sha256": digest, "data": data}, indent=1) + "\n"


def _open_envelope(path: Path) -> dict[str, Any]:
    raw = json.loads(path.read_text(encoding="utf-8"))
    data = raw["data"]
    body = json.dumps(data, sort_keys=True, separators=(",", ":"))
    if hashlib.sha256(body.encode()).hexdigest() != raw["sha256"]:
        raise ValueError("checksum mismatch")
    if not isinstance(data, dict):
        raise ValueError("not an object")
    return data


class Store:
    """The state directory. Methods block on disk I/O: call them from a thread."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    @property
    def logs_dir(self) -> Path:
        return self.dir / "logs"

    def load(self) -> PersistedState:
        """The persisted state; falls back to the previous copy if the current is damaged."""
        current, prev = self.dir / STATE_FILE, self.dir / PREV_FILE
        problems = []
        for path in (current, prev):
            if not path.exists():
                continue
            try:
                state = PersistedState.from_json(_open_envelope(path))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                problems.append(f"{path} is damaged ({type(exc).__name__}: {exc})")
                continue
            if problems:
                state.load_warning = "; ".join(problems) + f"; using {path}"
                log.error("%s", state.load_warning)
            return state
        state = PersistedState()
        if problems:
            state.load_warning = "; ".join(problems) + "; starting from the configured levers"
            log.error("%s", state.load_warning)
        return state

    def load_previous(self) -> PersistedState | None:
        """The previous copy (``state.prev.json``) alone; None when absent or damaged."""
        try:
            return PersistedState.from_json(_open_envelope(self.dir / PREV_FILE))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def keep_rejected(self, record: dict[str, Any]) -> Path:
        """Write ``record`` (lever sets that do not fit, and why) to ``state.rejected.json``
        atomically; returns its path. Raises ``StoreError``."""
        path = self.dir / REJECTED_FILE
        with self._lock:
            try:
                earlier = _open_envelope(path)
            except (OSError, ValueError, KeyError, TypeError):
                earlier = None
            if earlier is not None and earlier.get("sets") != record.get("sets"):
                # Other misfits than the ones kept there (a second upgrade): keep those too.
                os.replace(path, path.with_name(f"{path.stem}.prev{path.suffix}"))
            atomic_write(path, _envelope(record))
        return path

    def save(self, state: PersistedState) -> None:
        """Persist ``state`` atomically, keeping the replaced copy as the previous one."""
        with self._lock:
            current, prev = self.dir / STATE_FILE, self.dir / PREV_FILE
            text = _envelope(state.to_json())
            if current.exists():
                try:
                    PersistedState.from_json(_open_envelope(current))
                except (OSError, ValueError, KeyError, TypeError, AttributeError):
                    pass  # never let a damaged file become the fallback
                else:
                    with contextlib.suppress(OSError):
                        os.replace(current, prev)
            atomic_write(current, text)

    def append_history(self, record: dict[str, Any]) -> None:
        """Append one finished operation to ``operations.jsonl`` (best effort), rotating
        it first when the line would take it past ``HISTORY_MAX_BYTES``.

        Never onto a torn record: a full disk cut a record at a page boundary and the next
        one was appended onto the fragment, both lost. A write that fails part-way is
        truncated away; a fragment that could not be (a crash mid-write) is ended with a
        newline before the next record, so each record is a line of its own."""
        data = (json.dumps(record, sort_keys=True) + "\n").encode()
        path = self.dir / HISTORY_FILE
        with self._lock:
            try:
                size = path.stat().st_size if path.exists() else 0
                if size and size + len(data) > HISTORY_MAX_BYTES:
                    self._rotate_history(path)
                _append_line(path, data)
            except OSError as exc:
                log.warning(
                    "operation %s not recorded in %s: %s",
                    record.get("id"),
                    path,
                    describe_os_error(path, exc),
                )

    @staticmethod
    def _rotate_history(path: Path) -> None:
        """operations.jsonl -> .1 -> .2 ... -> .HISTORY_BACKUPS (the oldest dropped)."""
        for n in range(HISTORY_BACKUPS - 1, 0, -1):
            older = path.with_name(f"{path.name}.{n}")
            if older.exists():
                os.replace(older, path.with_name(f"{path.name}.{n + 1}"))
        os.replace(path, path.with_name(f"{path.name}.1"))
