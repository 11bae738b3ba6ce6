"""The files the daemon is given — its config, its token files, the TLS certificate and
key, the router's key, a model's ``config.json`` — read as regular files only, bounded,
with a deadline.

An ``open()`` of a FIFO waits for a writer, forever; a read from a hung NFS or FUSE mount
waits for the server, and a character device (``/dev/zero``) never ends. Read on the
event loop, any of them froze the daemon (its API, its watch of the server, its
SIGTERM); read in a worker thread, it kept that thread. So every such read here:

- opens without waiting (``O_NONBLOCK``: a FIFO opens at once) and refuses anything
  that is not a regular file (``fstat`` of what was opened: no race with a rename),
  naming the file, what it is and what to give instead;
- reads at most ``max_bytes`` (a larger file is refused, not read);
- runs in a thread of its own and is waited for at most ``timeout_s``: a read that
  hangs in the kernel (a dead mount) is refused when that passes, naming the file; its
  thread stays blocked until the kernel returns, and a second read of the same file is
  refused at once while it does (one stuck thread per file at most).

Symbolic links are followed (a Kubernetes ConfigMap is a link farm); the daemon's own
files under the state directory have their own rules (``store``: never through a link).
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: How long one read may take before it is refused (a local disk takes microseconds).
READ_TIMEOUT_S = 5.0
#: The default bound of one file (a config, a token, a certificate chain: far less).
MAX_BYTES = 4 << 20

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)

_stuck_lock = threading.Lock()
#: Files whose read has not returned yet (path -> when it began, monotonic).
_stuck: dict[str, float] = {}


class FileRefused(ValueError):
    """A file could not be read as a regular file in time; the message says which, why
    and what to do."""


@dataclass(frozen=True)
class FileRead:
    """A regular file's bytes and its ``fstat`` (mode and owner, for the token checks)."""

    data: bytes
    st: os.stat_result

    def text(self) -> str:
        """The bytes as UTF-8 (``FileRefused`` naming no file: the caller's message does)."""
        return self.data.decode("utf-8")


def read_regular(
    path: str | Path,
    what: str,
    *,
    max_bytes: int = MAX_BYTES,
    timeout_s: float | None = None,
) -> FileRead:
    """``path``'s bytes, if it is a regular file of at most ``max_bytes``, read within
    ``timeout_s`` (default ``READ_TIMEOUT_S``). ``what`` names it in messages ("config",
    "token file"). Raises
    ``FileRefused`` (not a regular file, too large, too slow, a read still hanging) or
    ``OSError`` (missing, unreadable: ``strerror`` says which). Blocking: call it from a
    worker thread (or before the event loop runs); it never blocks longer than
    ``timeout_s``."""
    if timeout_s is None:
        timeout_s = READ_TIMEOUT_S
    key = os.path.abspath(path)
    with _stuck_lock:
        began = _stuck.get(key)
        if began is not None:
            raise FileRefused(
                f"{what} {path}: an earlier read of it has not returned for "
                f"{time.monotonic() - began:.0f} s (a hung network mount?); nothing was read. "
                "Fix the mount or give a file on a local disk"
            )
        _stuck[key] = time.monotonic()
    box: list[FileRead | BaseException] = []

    def read() -> None:
        try:
            box.append(_read(path, what, max_bytes))
        except BaseException as exc:  # handed to the waiting caller
            box.append(exc)
        finally:
            with _stuck_lock:
                _stuck.pop(key, None)

    worker = threading.Thread(target=read, name=f"read {what}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not box:
        raise FileRefused(
            f"{what} {path} could not be read within {timeout_s:g} s (a hung network or "
            "FUSE mount?); nothing was read. Fix the mount or give a file on a local disk"
        )
    result = box[0]
    if isinstance(result, BaseException):
        raise result
    return result


def _is_devnull(st: os.stat_result) -> bool:
    if not stat.S_ISCHR(st.st_mode):
        return False
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return st.st_rdev == null.st_rdev


def _read(path: str | Path, what: str, max_bytes: int) -> FileRead:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if _is_devnull(st):
            return FileRead(b"", st)  # empty, never blocks: the usual "no file"
        if not stat.S_ISREG(st.st_mode):
            kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a file")
            raise FileRefused(
                f"{what} {path} is {kind}, not a regular file; nothing was read (a FIFO "
                "or a device could block the daemon): give a regular file"
            )
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise FileRefused(
                f"{what} {path} is larger than {max_bytes} bytes; nothing was used: "
                "give the right file"
            )
        return FileRead(b"".join(chunks), st)
    finally:
        os.close(fd)


#: How deep a JSON file the daemon is given may nest (a config.json nests 3 or 4 levels).
MAX_JSON_DEPTH = 64


def read_json(
    path: str | Path,
    what: str,
    *,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """``path`` parsed as JSON, read by :func:`read_regular`'s rules, nested at most
    ``max_depth`` levels. Raises ``FileRefused`` (also for the nesting: deep enough, it
    exhausted the parser's recursion — a bare 500 —, and anything deeper than a config
    needs is refused alike), ``ValueError`` (not JSON) or ``OSError``."""
    data = read_regular(path, what, max_bytes=max_bytes).data
    try:
        value = json.loads(data)
    except RecursionError:
        raise FileRefused(_too_deep(path, what, max_depth)) from None
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > max_depth:
                    raise FileRefused(_too_deep(path, what, max_depth))
                stack.append((child, depth + 1))
    return value


def _too_deep(path: str | Path, what: str, max_depth: int) -> str:
    return (
        f"{what} {path} nests deeper than {max_depth} levels; nothing was used: give the right file"
    )
