"""Which disk a path is on and whether it is full: failures caused by a full disk say so.

A launcher that cannot write (``ENOSPC``) exits with a bare "exit code 1" and an empty
log; a state write fails with ``OSError``. Both name the path; this adds the disk
(its mount point) and the space left, so the operator knows what to free.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

#: Below this many free bytes a disk counts as full (a log line or a state file no
#: longer fits reliably).
FULL_BELOW_BYTES = 1 << 20


def mount_point(path: Path) -> Path:
    """The mount point of the file system holding ``path`` (or its nearest existing
    parent)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    while not os.path.ismount(p) and p != p.parent:
        p = p.parent
    return p


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use where ``path`` lives (None: unknown)."""
    try:
        st = os.statvfs(mount_point(path))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def full_disk_note(path: Path) -> str | None:
    """A sentence naming the full disk that holds ``path``; None when it is not full."""
    free = free_bytes(path)
    if free is None or free >= FULL_BELOW_BYTES:
        return None
    return (
        f"the disk holding {path} (mounted at {mount_point(path)}) is full: {free} bytes "
        "free; free space there, then try again"
    )


def describe_os_error(path: Path, exc: OSError) -> str:
    """``exc`` for ``path`` in words: the disk and mount point when it is full, the
    mount point when it is read-only."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"the disk holding {path} (mounted at {mount_point(path)}) is full "
            f"({exc.strerror}); free space there"
        )
    if exc.errno == errno.EROFS:
        return (
            f"{path} is on a read-only file system (mounted at {mount_point(path)}); "
            "mount it read-write or choose another state_dir"
        )
    return f"{path}: {exc.strerror or exc}"
