"""The new server's log while it starts, shown under the operation's start phase."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sglang_supervisor_api.cli.client import Client
from sglang_supervisor_api.cli.client_errors import ClientError, NotFound
from sglang_supervisor_api.cli.render_live import log_line
from sglang_supervisor_api.cli.text import terminal_width

Emit = Callable[[str], None]


def new_lines(previous: Sequence[str], current: Sequence[str]) -> list[str]:
    """The lines of ``current`` after the longest overlap of ``previous``'s end with its
    start: what a ``tail`` gained since the last look (all of it when nothing overlaps)."""
    if not previous:
        return list(current)
    last = previous[-1]
    for k in range(min(len(previous), len(current)), 0, -1):
        if current[k - 1] == last and list(previous[-k:]) == list(current[:k]):
            return list(current[k:])
    return list(current)


class ServerLogTail:
    """The new server's log during a start phase, from ``GET /logs`` (when the daemon has it).

    Logs of earlier launches are never shown as the new one's: paths seen before the start
    phase began are remembered as stale, and the path the ``launch`` event names wins.
    """

    def __init__(self, client: Client, emit: Emit, *, tail: int = 40) -> None:
        self.client = client
        self.emit = emit
        self.tail = tail
        self.enabled = True
        self.active = False
        self.stale: set[str] = set()
        self.want: str | None = None
        self._path: str | None = None
        self._seen: list[str] = []
        self.width = terminal_width()
        #: How many log lines were shown live (all launches).
        self.shown = 0

    def remember_current(self) -> None:
        """Note the newest launch's log as not-the-new-one (call before the operation)."""
        text = self._fetch(0)
        if text is not None and text.path:
            self.stale.add(text.path)

    def _fetch(self, launch: int) -> Any:
        if not self.enabled:
            return None
        try:
            return self.client.logs(self.tail, launch)
        except NotFound as exc:
            if exc.endpoint_missing:
                self.enabled = False  # an older daemon: no live log, nothing else lost
            return None
        except ClientError:
            return None

    def begin(self) -> None:
        self.active = True
        self._seen = []
        self._path = None

    def launched(self, log_path: str | None) -> None:
        """The ``launch`` event named the new server's log file."""
        self.want = log_path

    def poll(self) -> None:
        if not (self.active and self.enabled):
            return
        for launch in (0, 1):
            text = self._fetch(launch)
            if text is None:
                return
            path = text.path
            if path is not None and (path in self.stale or (self.want and path != self.want)):
                if self.want is None:
                    return  # the new launch has not written a log yet
                continue
            if path != self._path:
                self._path, self._seen = path, []
            for line in new_lines(self._seen, text.lines):
                if is_probe_noise(line):
                    continue
                self.emit(log_line(line, self.width))
                self.shown += 1
            self._seen = list(text.lines)
            return

    def end(self) -> None:
        """The start phase ended: show what it logged last, then stop."""
        if self.active:
            self.poll()
            if self._path:
                self.stale.add(self._path)
        self.active = False
        self.want = None


_PROBES = (
    '"GET /health_generate ',
    '"GET /health ',
    '"GET /get_server_info ',
    '"GET /server_info ',
    '"GET /metrics ',
)


def is_probe_noise(line: str) -> bool:
    """An access-log line of the supervisor's own readiness/telemetry probes: not shown."""
    return any(p in line for p in _PROBES)
