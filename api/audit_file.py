"""The audit log's file writer: ``<state_dir>/audit.log``, rotated and bounded, written by
a thread of its own (``_audit_to_file``) through a handler that never follows a planted
symbolic link (``_NoFollowRotatingHandler``). What a record holds is
``sglang_supervisor_api.audit``.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import queue
from typing import Any

from sglang_supervisor.config import Settings


class _NoFollowRotatingHandler(logging.handlers.RotatingFileHandler):
    """A rotating log that never writes through a symbolic link planted under its name
    (the daemon may run as root): created 0600 with ``O_NOFOLLOW``."""

    def _open(self) -> Any:
        # The handler owns the stream and closes it.
        name, mode = self.baseFilename, self.mode
        return open(name, mode, encoding=self.encoding, errors=self.errors, opener=_nofollow)


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
