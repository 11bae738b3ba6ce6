"""The server's log, forwarded line by line into the daemon's own log (the journal).

``[server] log_to_journal = true``: besides its launch log file (``serverlogs``), every
line the server writes is logged by the daemon under the logger ``sglang`` with the
server's pid — ``INFO sglang: [pid 4242] [2026-12-01 10:00:00] Prefill batch. ...`` —
so ``journalctl -u sglang-supervisor`` shows both (``-p warning``: SGLang's warnings and
errors, which keep their level).

The server still writes only into its file (never a pipe that could block it): this
follows the file from a worker thread, as ``tail -F`` would — a new launch's log from its
first line, a file truncated by the size bound from its new start. Bounded: at most
``MAX_LINES_PER_S`` lines a second (a burst of one second's worth; what is over is
counted and said in one line naming the file that has them), ``MAX_LINE_CHARS`` per line,
``MAX_READ_BYTES`` read per poll. Terminal escapes (ANSI CSI, OSC) are dropped and other
control characters (NUL...) shown as ``\\xNN``: a line cannot paint a fake record on a
terminal, nor split a journald record. A line's level is its level field's (``ERROR:``
at its start, ``WARNING`` right after SGLang's ``[time]`` prefix, a ``Traceback``), not
the word anywhere in it. Secrets are replaced by ``<redacted>`` by the rule
every path out of the daemon follows (``redact.redact_text``): SGLang's print of its
``server_args`` (``'api_key': '...'``, any length), URL passwords and secret query
values, and the literal values of the secret levers and environment variables the
server was given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sglang_supervisor.redact import redact_text

log = logging.getLogger("sglang")

POLL_S = 0.5
MAX_LINES_PER_S = 200
MAX_LINE_CHARS = 4000
#: How far past the cut a line is scrubbed (a URL password or ``api_key='...'`` across it).
SCRUB_MARGIN = 512
MAX_READ_BYTES = 1 << 20
#: A line's level field: at its start (uvicorn's ``ERROR:    ...``, Python's default
#: ``WARNING:root:...``), or right after SGLang's ``[time TP0] `` prefix (a logging config
#: that prints levels); a traceback's first line. Not the word anywhere in the line: a
#: request's text or a path saying ERROR made it an error.
_LEVEL = re.compile(
    r"^(?:\[[^\]\n]{1,80}\] )?(?P<level>CRITICAL|ERROR|WARNING)\b"
    r"|^(?P<traceback>Traceback) \(most recent call last\):"
)
_LEVELS = {
    "CRITICAL": logging.CRITICAL,
    "ERROR": logging.ERROR,
    "Traceback": logging.ERROR,
    "WARNING": logging.WARNING,
}
#: ANSI CSI (``ESC [ ... m``, cursor moves) and OSC (``ESC ] ... BEL``: a terminal's title,
#: links) sequences: dropped, a terminal showing the journal must not obey the server.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]{0,64}[ -/]{0,8}[@-~]?|\x1b\][^\x07\x1b\n]{0,4096}(?:\x07|\x1b\\)?"
)
#: Other control characters (NUL splits a journald record; C1's 0x9b is a CSI too),
#: shown as ``\xNN`` rather than sent; a tab stays.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class Source:
    """The log being followed and what must not be forwarded from it."""

    path: Path
    pid: int
    secrets: tuple[str, ...]


def line_level(line: str) -> int:
    """The level a line's level field says (``ERROR:    ...``, ``[time TP0] WARNING ...``,
    a ``Traceback`` line); INFO else."""
    m = _LEVEL.match(line)
    if m is None:
        return logging.INFO
    return _LEVELS[m.group("level") or m.group("traceback")]


def printable(line: str) -> str:
    """``line`` without terminal escape sequences, its other control characters shown."""
    if not _CONTROL.search(line):
        return line
    line = _ESCAPES.sub("", line)
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", line)


class LogForwarder:
    """Follows the current server's log; ``run`` until cancelled, ``stop`` flushes."""

    def __init__(
        self,
        source: Callable[[], Source | None],
        *,
        earlier: frozenset[Path] = frozenset(),
        poll_s: float = POLL_S,
        max_lines_per_s: int = MAX_LINES_PER_S,
    ) -> None:
        self._source = source
        #: The launch logs there were before this daemon: an adopted server's is followed
        #: from its end; any other from its first line.
        self._earlier = earlier
        self._poll_s = poll_s
        self._rate = max_lines_per_s
        self._path: Path | None = None
        self._offset = 0
        self._partial = b""
        self._tokens = float(max_lines_per_s)
        self._refilled = time.monotonic()
        self._dropped = 0
        self._task: asyncio.Task[None] | None = None
        #: One poll at a time: a cancelled ``run`` leaves its worker-thread poll going
        #: while ``stop`` flushes in another (two readers would forward lines twice).
        self._polling = threading.Lock()
        self._started = False
        self._last: Source | None = None
        #: Wall time this forwarder began (a server launched since is followed from its start).

    def start(self) -> None:
        """Start following in the background (the event loop must be running)."""
        self._task = asyncio.create_task(self.run(), name="log-forwarder")

    async def stop(self) -> None:
        """Stop following, after forwarding what the server wrote until now."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await asyncio.to_thread(self.poll, self._source())

    async def run(self) -> None:
        while True:
            # The source is read on the loop (the supervisor's view), the file in a thread.
            await asyncio.to_thread(self.poll, self._source())
            await asyncio.sleep(self._poll_s)

    def poll(self, src: Source | None) -> int:
        """Forward what ``src`` gained since the last poll; returns the lines logged."""
        with self._polling:
            return self._poll(src)

    def _poll(self, src: Source | None) -> int:
        src = src or self._last  # the server is gone: its last lines still count
        if src is None:
            return 0
        self._last = src
        self._refill(src)
        if not self._started:
            # An adopted server's log is followed from its end: its past was forwarded by
            # the daemon that launched it. A launch of this daemon's from its first line.
            self._offset = 0
            if src.path in self._earlier:
                with contextlib.suppress(OSError):
                    self._offset = os.path.getsize(src.path)
            self._path = src.path
            self._started = True
        if src.path != self._path:
            self._flush_partial(src)
            self._path, self._offset = src.path, 0
        try:
            size = os.path.getsize(src.path)
            if size < self._offset:  # copy-truncated by the size bound: new start
                self._offset, self._partial = 0, b""
            if size == self._offset:
                return 0
            with open(src.path, "rb") as f:
                f.seek(self._offset)
                data = f.read(MAX_READ_BYTES)
        except OSError:
            return 0
        self._offset += len(data)
        data = self._partial + data
        complete, _, self._partial = data.rpartition(b"\n")
        if len(self._partial) > MAX_LINE_CHARS:  # a line without end: forward its start
            complete, self._partial = data, b""
        if not complete:
            return 0
        return self._emit(src, complete.decode(errors="replace").splitlines())

    def _flush_partial(self, src: Source) -> None:
        if self._partial:
            self._emit(src, [self._partial.decode(errors="replace")])
            self._partial = b""

    def _refill(self, src: Source) -> None:
        """The rate bound's tokens; says once how many lines it held back, when it can."""
        now = time.monotonic()
        self._tokens = min(float(self._rate), self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        if self._dropped and self._tokens >= 1:
            self._tokens -= 1
            log.warning(
                "[pid %d] %d lines of the server's log not forwarded (over %d lines/s); "
                "%s has them",
                src.pid,
                self._dropped,
                self._rate,
                src.path,
                extra={"server_pid": src.pid},
            )
            self._dropped = 0

    def _emit(self, src: Source, lines: list[str]) -> int:
        logged = 0
        for line in lines:
            if not line.strip():
                continue
            if self._tokens < 1:
                self._dropped += 1
                continue
            self._tokens -= 1
            # Scrubbed beyond the cut, then cut: a secret across the cut would keep its
            # first part; scrubbing a whole 1 MiB line would cost far more than the cut.
            margin = SCRUB_MARGIN + max((len(x) for x in src.secrets), default=0)
            text = redact_text(line[: MAX_LINE_CHARS + margin], src.secrets)
            text = printable(text)[:MAX_LINE_CHARS]
            level = line_level(printable(line[:200]))
            log.log(level, "[pid %d] %s", src.pid, text, extra={"server_pid": src.pid})
            logged += 1
        return logged
