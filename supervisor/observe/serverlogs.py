"""The server's log files: one per launch, size-bounded, the last N launches kept.

The server writes straight into its file (never through a pipe, which would block it
when full and die with the daemon). To bound the size without the server's help, a file
over the limit is copied to ``<name>.1`` and truncated in place (logrotate's
``copytruncate``): the server opened it with O_APPEND, so its next line lands at the new
start. A few lines written during the copy can be lost; nothing blocks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

PATTERN = "server-*.log"


def launch_logs(logs_dir: Path) -> list[Path]:
    """Launch logs, newest first (names start with the launch time). Regular files only:
    a symbolic link planted in the directory (to ``/etc/shadow``...) is no launch's log,
    and ``GET /logs`` must not serve what it points to (the daemon may run as root)."""
    try:
        files = [p for p in logs_dir.glob(PATTERN) if stat.S_ISREG(p.lstat().st_mode)]
    except OSError:
        return []
    return sorted(files, key=lambda p: p.name, reverse=True)


def log_for_launch(logs_dir: Path, launch: int) -> Path | None:
    """The log of launch ``launch`` (0 = the newest, 1 = the one before...)."""
    logs = launch_logs(logs_dir)
    return logs[launch] if 0 <= launch < len(logs) else None


def prune(logs_dir: Path, keep: int) -> list[Path]:
    """Delete the logs of all but the newest ``keep`` launches; returns what was deleted."""
    gone = []
    for path in launch_logs(logs_dir)[keep:]:
        for p in (path, path.with_name(path.name + ".1")):
            with contextlib.suppress(OSError):  # gone already, or a read-only directory
                p.unlink()
                gone.append(p)
    return gone


def bound_size(path: Path, max_bytes: int) -> bool:
    """Copy-truncate ``path`` when it is larger than ``max_bytes``; True if it did."""
    try:
        if os.path.getsize(path) <= max_bytes:
            return False
        shutil.copyfile(path, path.with_name(path.name + ".1"))
        os.truncate(path, 0)
    except OSError:
        return False
    return True
