"""The server's SGLang cache directory and its size, for ``/status``: what the launches
compiled (Triton, TorchInductor, CUDA, FlashInfer, DeepGEMM...) and the next reuses.

A walk of the directory, in a worker thread, at most once a minute (the watcher asks);
``/status`` shows the last one. Bounded: it stops after ``MAX_ENTRIES`` entries and says
the size is at least that much.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Entries walked at most per measurement (a cache of small files can hold many).
MAX_ENTRIES = 500_000
#: The least time between two measurements.
EVERY_S = 60.0


@dataclass(frozen=True)
class Usage:
    path: str
    bytes: int
    files: int
    #: False when the walk stopped at ``MAX_ENTRIES`` (the size is a lower bound).
    complete: bool
    measured_at: float
    #: Why it could not be read (None: it was).
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "bytes": self.bytes,
            "files": self.files,
            "complete": self.complete,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.measured_at)),
            "error": self.error,
        }


def measure(path: Path, max_entries: int = MAX_ENTRIES) -> Usage:
    """The bytes and files under ``path`` (symbolic links not followed). Blocking."""
    total = files = entries = 0
    stack = [str(path)]
    error: str | None = None
    while stack and entries < max_entries:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                for entry in it:
                    entries += 1
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                            files += 1
                    except OSError:
                        continue
                    if entries >= max_entries:
                        break
        except FileNotFoundError:
            if top == str(path):
                error = "does not exist yet (created at the next launch)"
        except OSError as exc:
            if top == str(path):
                error = f"cannot be read: {exc.strerror or exc}"
    return Usage(str(path), total, files, not stack and entries < max_entries, time.time(), error)


class CacheDirUsage:
    """The last measurement of the cache directory, and when the next is due."""

    def __init__(self, every_s: float = EVERY_S) -> None:
        self.every_s = every_s
        self._last: Usage | None = None
        self._next = 0.0
        self._launch: object | None = None

    @property
    def last(self) -> Usage | None:
        return self._last

    def due(self, path: Path, now: float, launch: object | None) -> bool:
        """Whether to measure now: once a minute, and at once for another directory or
        another launch (a launch compiles)."""
        moved = self._last is not None and self._last.path != str(path)
        return now >= self._next or moved or launch is not self._launch

    def started(self, now: float, launch: object | None) -> None:
        self._next, self._launch = now + self.every_s, launch

    def measured(self, usage: Usage) -> None:
        self._last = usage
