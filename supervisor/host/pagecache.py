"""The page cache before the stop: the new set's weight files read into it while the old
server still serves, so the load after the stop reads memory, not disk or network
storage (SGLang's own ``--weight-loader-prefetch-checkpoints`` prefetches during the load,
inside the downtime). Bounded by the RAM available after the hierarchical cache's needs
and a margin (``budget``); skipped, with the reason, when the weights do not fit.

``drop`` evicts files from the page cache (``posix_fadvise(DONTNEED)``): the benchmark's
cold start. Everything here blocks: call it from a worker thread.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sglang_supervisor.units import GB, GiB, MiB

#: RAM left to everything else after the warm-up (the daemon, the server's own start-up).
WARMUP_MARGIN = 8 * GiB
CHUNK = 16 * MiB
#: Files read at once: network storage serves several streams faster than one.
READERS = 4


@dataclass(frozen=True)
class Budget:
    """What may go into the page cache before the stop, and why that much."""

    bytes: int
    why: str


def budget(available: int, source: str, new_pool: int, freed: int) -> Budget:
    """The page cache the warm-up may fill: the RAM available now (``source``: host or
    cgroup), less what the new server's hierarchical cache will pin beyond what the old
    one frees (pages read now must survive that), less ``WARMUP_MARGIN``."""
    after_pools = min(available, available + freed - new_pool)
    room = max(0, after_pools - WARMUP_MARGIN)
    why = f"{available / GB:.1f} GB of RAM available ({source})"
    if new_pool > freed:
        why += f", less the hierarchical cache's {(new_pool - freed) / GB:.1f} GB more"
    why += f", less a {WARMUP_MARGIN / GiB:.0f} GiB margin"
    return Budget(room, why)


@dataclass
class Warmed:
    """What one warm-up read."""

    read_bytes: int = 0
    files: int = 0
    seconds: float = 0.0
    #: Why it ended before every file was read (None: all were).
    stopped: str | None = None
    errors: list[str] = field(default_factory=list)


def read(files: Sequence[Path], cancel: threading.Event, deadline: float) -> Warmed:
    """Read ``files`` whole (``READERS`` at a time, sequential reads of ``CHUNK``) so the
    kernel keeps them in its page cache; ends early at ``deadline`` (monotonic) or when
    ``cancel`` is set. A file that cannot be read is noted, not fatal (the load will say)."""
    todo = list(files)
    out = Warmed()
    lock = threading.Lock()
    t0 = time.monotonic()

    def worker() -> None:
        buf = bytearray(CHUNK)
        while True:
            with lock:
                if not todo or out.stopped is not None:
                    return
                path = todo.pop(0)
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as exc:
                with lock:
                    out.errors.append(f"{path}: {exc.strerror or exc}")
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                with os.fdopen(fd, "rb", buffering=0, closefd=False) as f:
                    while n := f.readinto(buf):
                        with lock:
                            out.read_bytes += n
                            if cancel.is_set():
                                out.stopped = "cancelled"
                            elif time.monotonic() >= deadline:
                                out.stopped = "its deadline passed (warmup_timeout_s)"
                            if out.stopped is not None:
                                return
                with lock:
                    out.files += 1
            except OSError as exc:
                with lock:
                    out.errors.append(f"{path}: {exc.strerror or exc}")
            finally:
                os.close(fd)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(READERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.seconds = time.monotonic() - t0
    return out


def drop(files: Sequence[Path]) -> int:
    """Evict ``files`` from the page cache (clean pages only: they were only read);
    returns their bytes."""
    total = 0
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total
