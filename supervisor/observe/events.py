"""An in-process event bus: state transitions and operation phases, for ``GET /events``.

Subscribers get a bounded queue each; a slow subscriber loses its oldest events rather
than slowing the supervisor down. ``publish`` never blocks and never raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

Event = dict[str, Any]


class EventBus:
    def __init__(self, history: int = 200, queue_size: int = 1000) -> None:
        self._subscribers: set[asyncio.Queue[Event]] = set()
        self._history: deque[Event] = deque(maxlen=history)
        self._queue_size = queue_size
        self._seq = itertools.count(1)

    def publish(self, kind: str, **data: Any) -> Event:
        """Send ``{seq, time, kind, ...data}`` to every subscriber. Call from the loop thread."""
        event: Event = {"seq": next(self._seq), "time": time.time(), "kind": kind, **data}
        self._history.append(event)
        for q in list(self._subscribers):
            if q.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
            q.put_nowait(event)
        return event

    def recent(self) -> list[Event]:
        return list(self._history)

    @contextlib.contextmanager
    def subscription(self, replay: bool = False) -> Iterator[asyncio.Queue[Event]]:
        """A queue receiving every event from now on (after the recent history when
        ``replay``). Waiting on it with a timeout is safe: nothing is lost by cancelling."""
        q: asyncio.Queue[Event] = asyncio.Queue(self._queue_size)
        if replay:
            for event in list(self._history)[-self._queue_size :]:
                q.put_nowait(event)
        self._subscribers.add(q)
        try:
            yield q
        finally:
            self._subscribers.discard(q)
