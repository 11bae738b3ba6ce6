"""Following an operation live: its phases as they start and end, per-GPU memory while
the GPUs are released, and the new server's log while it starts.

The daemon's event stream (``GET /events``) says *when* something happened; the operation
record (``GET /operations/{id}``) says *what*, in order. So an event about our operation
triggers a fetch of the record, and the record is rendered; with no stream the record is
polled every ``poll_s``. A stream that cannot be opened, or breaks, only means polling.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sglang_supervisor_api.cli import render_live
from sglang_supervisor_api.cli.client import Client, Json
from sglang_supervisor_api.cli.client_errors import ClientError
from sglang_supervisor_api.cli.event_stream import EventStream, open_event_stream
from sglang_supervisor_api.cli.server_log import ServerLogTail

Emit = Callable[[str], None]

#: Sentinel the event pump puts on the queue when the stream ends or breaks.
_END: Json = {"kind": "__end__"}


def epoch(iso: object) -> float | None:
    """An ISO timestamp of the daemon's (``created_at``, a phase's ``started_at``) as a Unix
    time; None when absent or unreadable."""
    if not isinstance(iso, str) or not iso:
        return None
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


def since_start(op: Json, iso: object) -> float | None:
    """Seconds from the operation's start to ``iso``, both read on the daemon's clock (so
    the same whenever the follower attached); None when either is unknown."""
    t0, at = epoch(op.get("created_at")), epoch(iso)
    return None if t0 is None or at is None else max(0.0, at - t0)


class SeqFilter:
    """Drops events already seen: a stream reopened with ``replay`` sends history again.

    Events are numbered by ``seq`` within one daemon's life; a smaller ``seq`` with a later
    ``time`` is a restarted daemon, not a repeat.
    """

    def __init__(self) -> None:
        self.seq = 0
        self.time = 0.0

    def fresh(self, event: Json) -> bool:
        seq, at = event.get("seq"), event.get("time")
        if not isinstance(seq, int) or not isinstance(at, (int, float)):
            return True
        if seq <= self.seq and at <= self.time:
            return False
        self.seq, self.time = seq, float(at)
        return True


class _EventPump(threading.Thread):
    """Reads the event stream in the background into a queue (ends with ``_END``)."""

    def __init__(self, stream: EventStream, out: queue.Queue[Json]) -> None:
        super().__init__(name="sglang-supervisor-events", daemon=True)
        self.stream = stream
        self.out = out

    def run(self) -> None:
        try:
            for event in self.stream:
                self.out.put(event)
        except ClientError:
            pass
        finally:
            self.out.put(_END)


class OperationFollower:
    """Shows one operation as it runs and returns its final record.

    Usage: ``f = OperationFollower(client, emit); f.prepare()``, submit the operation,
    then ``f.follow(op)``; ``f.close()`` at the end (a context manager does it).
    ``emit`` None follows silently (``--json``).
    """

    def __init__(
        self,
        client: Client,
        emit: Emit | None,
        *,
        use_events: bool = True,
        poll_s: float = 0.2,
        safety_poll_s: float = 1.0,
        sample_every_s: float = 0.25,
        log_every_s: float = 0.4,
    ) -> None:
        self.client = client
        self.emit: Emit = emit or (lambda _line: None)
        self.quiet = emit is None
        self.use_events = use_events
        self.poll_s = poll_s
        self.safety_poll_s = safety_poll_s
        self.sample_every_s = sample_every_s
        self.log_every_s = log_every_s
        self.logs = ServerLogTail(client, self.emit)
        self._stream: EventStream | None = None
        self._queue: queue.Queue[Json] = queue.Queue()
        self._t0 = time.monotonic()
        #: The operation's start on the daemon's clock: every time shown counts from it.
        self._op_t0: float | None = None
        self._started: set[tuple[str, str]] = set()
        self._ended: set[tuple[str, str]] = set()
        self._pending_sample: Json | None = None
        self._last_sample_at = 0.0
        self._last_sample: list[tuple[Any, Any]] | None = None
        self._seen = SeqFilter()
        #: A broken stream is reopened (with replay) this many times, then polling it is.
        self._reopens_left = 3
        self._reopen_at: float | None = None

    def __enter__(self) -> OperationFollower:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def streaming(self) -> bool:
        return self._stream is not None

    def prepare(self) -> None:
        """Before submitting: open the event stream (with replay, so nothing of the new
        operation is missed) and note the current log file. Never raises for a missing
        stream or log endpoint; connection errors do raise (``ClientError``)."""
        if self.use_events and not self.quiet:
            self._open_stream()
        if not self.quiet:
            self.logs.remember_current()

    def _open_stream(self) -> None:
        self._reopen_at = None
        try:
            self._stream = open_event_stream(self.client, replay=True)
        except ClientError:
            self._stream = None
        else:
            _EventPump(self._stream, self._queue).start()

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    # ---------------------------------------------------------------- follow

    def _elapsed(self, at: float | None = None) -> float:
        """Seconds since the operation started, at the daemon's Unix time ``at`` (a
        phase's start or end, a sample's time); without one, now. A daemon that gives no
        start time: since the follower attached."""
        if self._op_t0 is not None:
            return max(0.0, (time.time() if at is None else at) - self._op_t0)
        return time.monotonic() - self._t0

    def follow(self, op: Json) -> Json:
        """Render ``op`` until it has ended; returns the final record. Raises
        ``ClientError`` when the daemon cannot be asked any more, ``KeyboardInterrupt``
        on Ctrl-C (the operation goes on in the daemon)."""
        self._t0 = time.monotonic()
        self._op_t0 = epoch(op.get("created_at"))
        op_id = str(op["id"])
        self._render(op)
        if op.get("state") != "running":
            return op
        interval = self.safety_poll_s if self.streaming else self.poll_s
        next_poll = time.monotonic() + interval
        next_log = time.monotonic()
        while True:
            now = time.monotonic()
            wake = next_poll
            if self.logs.active:
                wake = min(wake, next_log)
            if self._pending_sample is not None:
                wake = min(wake, self._last_sample_at + self.sample_every_s)
            if self._reopen_at is not None:
                wake = min(wake, self._reopen_at)
            refresh = self._wait_event(op_id, max(0.0, wake - now))
            now = time.monotonic()
            if self._reopen_at is not None and now >= self._reopen_at:
                self._open_stream()
                interval = self.safety_poll_s if self.streaming else self.poll_s
            if not self.streaming:
                interval = self.poll_s
            if refresh or now >= next_poll:
                op = self.client.operation(op_id)
                self._render(op)
                next_poll = now + interval
                if op.get("state") != "running":
                    self._flush_sample()
                    self.logs.end()
                    return op
            if self.logs.active and now >= next_log:
                self.logs.poll()
                next_log = time.monotonic() + self.log_every_s
            if (
                self._pending_sample is not None
                and now - self._last_sample_at >= self.sample_every_s
            ):
                self._flush_sample()

    def _wait_event(self, op_id: str, timeout_s: float) -> bool:
        """Take the events that came (waiting up to ``timeout_s`` for the first); True when
        one says our operation's record changed."""
        if self._stream is None and self._queue.empty():
            time.sleep(timeout_s)
            return False
        refresh = False
        try:
            event = self._queue.get(timeout=timeout_s) if timeout_s > 0 else self._queue.get(False)
        except queue.Empty:
            return False
        while True:
            refresh |= self._on_event(op_id, event)
            try:
                event = self._queue.get_nowait()
            except queue.Empty:
                return refresh

    def _on_event(self, op_id: str, event: Json) -> bool:
        kind = event.get("kind")
        if event is _END:
            # Poll until the stream is back (a few tries), or for good.
            self._stream = None
            if self._reopens_left > 0:
                self._reopens_left -= 1
                self._reopen_at = time.monotonic() + 0.2
            return True
        if not self._seen.fresh(event):
            return False
        if kind == "operation":
            return event.get("id") == op_id
        if event.get("operation") != op_id:
            return False
        if kind == "phase":
            return True
        if kind == "release_sample":
            self._pending_sample = event
        elif kind == "launch":
            self.logs.launched(event.get("log"))
        return False

    def _flush_sample(self) -> None:
        sample, self._pending_sample = self._pending_sample, None
        if sample is None:
            return
        used = [(g.get("index"), g.get("memory_used_bytes")) for g in sample.get("gpus") or []]
        if used == self._last_sample:
            return  # nothing moved: say it once
        self._last_sample = used
        self._last_sample_at = time.monotonic()
        at = sample.get("time")
        elapsed = self._elapsed(float(at) if isinstance(at, (int, float)) else None)
        self.emit(render_live.memory_line(sample.get("gpus") or [], elapsed))

    def _render(self, op: Json) -> None:
        for phase in op.get("phases") or []:
            key = (str(phase.get("name")), str(phase.get("started_at")))
            name = key[0]
            running = phase.get("state") == "running"
            if running and key not in self._started:
                self._started.add(key)
                at = self._elapsed(epoch(phase.get("started_at")))
                self.emit(render_live.phase_line(phase, at, started=True))
                if name.endswith("start"):
                    self.logs.begin()
                    self.logs.poll()
            elif not running and key not in self._ended:
                self._started.add(key)
                self._ended.add(key)
                if name.endswith("release"):
                    self._flush_sample()
                    self._last_sample = None
                if name.endswith("start"):
                    with contextlib.suppress(ClientError):
                        self.logs.end()
                at = self._elapsed(epoch(phase.get("ended_at")))
                self.emit(render_live.phase_line(phase, at))
