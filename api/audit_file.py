"""The audit log's file writer: ``<state_dir>/audit.log``, rotated and bounded, written by
a thread of its own (``_audit_to_file``) through a handler that never follows a planted
symbolic link (``_NoFollowRotatingHandler``). What a record holds is
``sglang_supervisor_api.audit``.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import queue
import sys
from pathlib import Path
from typing import Any

from sglang_supervisor.config import Settings
from sglang_supervisor.diskspace import describe_os_error

log = logging.getLogger("supervisor")


class _NoFollowRotatingHandler(logging.handlers.RotatingFileHandler):
    """A rotating log that never writes through a symbolic link planted under its name
    (the daemon may run as root): created 0600 with ``O_NOFOLLOW``.

    A record it cannot write (a full disk, a read-only one) is counted, not printed as a
    logging traceback per audited call: the first of a run of failures is one warning on
    the daemon's log naming the file and the disk, the first record written again says
    how many were lost (each is in the daemon's log too: the audit logger propagates
    there). A record cut by the failure is truncated away, and the file reopened; a
    fragment that could not be (a crash) is ended with a newline before the next one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Records not written since the last one that was (on the writer's thread only).
        self.lost = 0
        #: The file's size before the record being written (None: not known).
        self._before: int | None = None

    def _open(self) -> Any:
        # The handler owns the stream and closes it.
        name, mode = self.baseFilename, self.mode
        stream = open(  # noqa: SIM115 - the handler owns the stream and closes it
            name, mode, encoding=self.encoding, errors=self.errors, opener=_nofollow
        )
        try:
            fd = stream.fileno()
            size = os.fstat(fd).st_size
            if size and _last_byte(name) != b"\n":
                stream.write("\n")  # a record cut by a full disk ends here, alone
                stream.flush()
        except OSError:
            pass  # writing the next record says so, if it fails too
        return stream

    def emit(self, record: logging.LogRecord) -> None:
        lost = self.lost
        try:
            self._before = os.stat(self.baseFilename, follow_symlinks=False).st_size
        except OSError:
            self._before = None
        super().emit(record)
        if lost and self.lost == lost:  # this one was written
            log.warning(
                "audit log %s is written again; %d audit records were lost meanwhile "
                "(they are in this log)",
                self.baseFilename,
                lost,
                extra={"audit_records_lost": lost},
            )
            self.lost = 0

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        self.lost += 1
        stream, self.stream = self.stream, None  # reopened for the next record
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()
        if self._before is not None:  # the record's fragment goes (the file is ours alone)
            with contextlib.suppress(OSError):
                fd = os.open(self.baseFilename, os.O_WRONLY | os.O_NOFOLLOW)
                try:
                    os.ftruncate(fd, self._before)
                finally:
                    os.close(fd)
        if self.lost == 1:
            why = (
                describe_os_error(Path(self.baseFilename), exc)
                if isinstance(exc, OSError)
                else f"{type(exc).__name__}: {exc}"
            )
            log.warning(
                "audit log %s: a record was not written (%s); the audit records go on "
                "to this log only until it can be written again",
                self.baseFilename,
                why,
                extra={"audit_log_error": why},
            )


def _last_byte(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, 1, size - 1) if size else b""
    finally:
        os.close(fd)


def _nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW, 0o600)


def _audit_to_file(settings: Settings) -> logging.handlers.QueueListener:
    """Mutating calls also go to ``<state_dir>/audit.log`` (JSON lines), written by a
    thread of their own: a route only queues its record (a write and a rotation are
    disk work, never done on the event loop). ``stop()`` the returned listener at exit:
    it writes what is still queued."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    # Bounded: refused calls are audited too, and anyone who reaches the port can make them.
    handler = _NoFollowRotatingHandler(
        settings.state_dir / "audit.log", maxBytes=16 << 20, backupCount=3
    )
    handler.setFormatter(logging.Formatter("%(message)s"))
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(records, handler)
    listener.start()
    audit = logging.getLogger("supervisor.audit")
    audit.addHandler(logging.handlers.QueueHandler(records))
    audit.setLevel(logging.INFO)
    return listener
