"""``<state_dir>/daemon.lock``: one daemon per state directory, and how others see it.

The daemon holds an exclusive ``flock`` on the file for its whole life and writes its pid
into it; the kernel drops the lock when the process ends, however it ends. Standard
library only (``cleanup`` reads it without the server side's imports).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "daemon.lock"


class StateDirBusy(RuntimeError):
    """A daemon runs on the state directory; ``pid`` is what it wrote in the lock."""

    def __init__(self, state_dir: Path, pid: str) -> None:
        super().__init__(
            f"a sglang-supervisor daemon (pid {pid}) already runs on state dir {state_dir}"
        )
        self.state_dir = state_dir
        self.pid = pid


def lock_state_dir(state_dir: Path) -> int:
    """Take the lock for this process (kept until it exits); returns its descriptor.

    Raises ``StateDirBusy`` naming the pid that holds it.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    # O_NOFOLLOW: the lock is truncated and written; a link planted there must not make
    # the daemon (as root) truncate the file it points to.
    fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _pid_in(fd)
        os.close(fd)
        raise StateDirBusy(state_dir, holder) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def daemon_holding(state_dir: Path) -> str | None:
    """The pid of the daemon running on ``state_dir`` (None when none does). Creates
    nothing; briefly takes and drops the lock when it is free."""
    try:
        fd = os.open(state_dir / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _pid_in(fd)
    finally:
        os.close(fd)
    return None


def _pid_in(fd: int) -> str:
    return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
