"""The journal: the only code that changes what is persisted in ``state.json``.

Each change is a named call saying what happened (a launch was recorded, an apply began,
levers were committed, a server is gone), so the state file can be read as the record of
those events. The calls write through ``Store`` in a worker thread; all but ``commit``
report a failed write as a warning in /status rather than failing the operation (the
server keeps serving; the next write retries).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_supervisor.host.backend import ServerHandle
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.store import PersistedState, RecordedServer, Store, StoreError

log = logging.getLogger("supervisor")


class Journal:
    """The persisted state of one supervisor, changed only through named calls."""

    def __init__(self, store: Store, warn: Callable[[str], None]) -> None:
        self.store = store
        self._warn = warn
        self._state = PersistedState()

    # ------------------------------------------------------------------ reading

    @property
    def dir(self) -> Path:
        return self.store.dir

    @property
    def logs_dir(self) -> Path:
        return self.store.logs_dir

    @property
    def recorded(self) -> PersistedState:
        """What was persisted (read it; change it only through the calls below)."""
        return self._state

    async def load(self) -> PersistedState:
        """Read ``state.json`` (or its previous copy); its problems become warnings."""
        self._state = await asyncio.to_thread(self.store.load)
        if self._state.load_warning:
            self._warn(self._state.load_warning)
        return self._state

    async def load_previous(self) -> PersistedState | None:
        """The previous copy of the state (``state.prev.json``), for levers that fit when
        the current ones no longer do; None when there is none."""
        return await asyncio.to_thread(self.store.load_previous)

    async def keep_rejected(self, record: dict[str, Any]) -> Path | None:
        """Keep persisted levers that no longer fit in ``state.rejected.json`` (they would
        be overwritten by the next save); its path, or None when it cannot be written
        (then a warning says so)."""
        try:
            return await asyncio.to_thread(self.store.keep_rejected, record)
        except StoreError as exc:
            log.error("%s", exc)
            self._warn(str(exc))
            return None

    # ----------------------------------------------------------------- changing

    async def record_launch(self, handle: ServerHandle, levers: LeverSet) -> None:
        """A launcher was spawned with ``levers``: a restarted daemon can find it again.
        (The current levers change only at ``commit``.)"""
        self._state.server = RecordedServer(
            handle.pid, handle.create_time, handle.tag, str(handle.log_path), levers.to_json()
        )
        self._state.stopped_by = None  # something runs again: an operator's stop is over
        await self._save_quietly()

    async def record_ready(self) -> None:
        """The recorded server answered /health_generate: a restarted daemon that finds
        it not answering judges it by the liveness rules (hung), not a start timeout."""
        if self._state.server is not None and not self._state.server.ready:
            self._state.server.ready = True
            await self._save_quietly()

    async def record_operator_stop(self, op_id: str) -> None:
        """An operator asked for a stop (recorded before anything is stopped): the server
        stays stopped across daemon restarts, even one in the middle of the stop."""
        self._state.stopped_by = op_id
        await self._save_quietly()

    async def record_gone(self) -> None:
        """The recorded server was torn down (released or not): nothing to adopt."""
        self._state.server = None
        await self._save_quietly()

    def record_crashes(
        self, restarts: int, by_reason: Mapping[str, int], recent: Sequence[float]
    ) -> None:
        """The server's restarts and its failures within the crash-loop window (unix
        times), written with the next save: a restarted daemon goes on counting them."""
        self._state.crashes = {
            "restarts": restarts,
            "by_reason": dict(by_reason),
            "recent": [round(t, 3) for t in recent],
        }

    def record_baseline(self, baseline: Mapping[int, int]) -> None:
        """GPU memory measured with nothing of ours running (written with the next save)."""
        self._state.baseline = dict(baseline)

    async def begin_apply(self, op_id: str, levers: LeverSet, path: str = "restart") -> None:
        """An apply is about to stop the server (``path`` "restart") or change it in place
        ("live", "weights"): if the daemon dies now, the next one knows an apply was
        interrupted and starts the last-good levers (a server changed in place is never
        adopted then: what it serves is not known)."""
        self._state.pending_operation = {
            "id": op_id,
            "kind": "apply",
            "levers": levers.to_json(),
            "path": path,
        }
        await self._save_quietly()

    async def clear_pending(self, *, save: bool = True) -> None:
        """The pending operation has ended (whatever its outcome)."""
        if self._state.pending_operation is None:
            return
        self._state.pending_operation = None
        if save:
            await self._save_quietly()

    def record_changed_in_place(self, levers: LeverSet) -> None:
        """The recorded server now serves ``levers``, changed without a restart (written
        with the commit that follows): the next daemon adopts it with them."""
        if self._state.server is not None:
            self._state.server.levers = levers.to_json()

    async def commit(self, levers: LeverSet) -> None:
        """``levers`` serve and are proven: they become current and last-good.

        Raises ``StoreError`` (the new levers serve, but would not survive a restart)."""
        self._state.levers = levers
        self._state.last_good = levers
        self._state.pending_operation = None
        await asyncio.to_thread(self.store.save, self._state)

    async def flush(self) -> None:
        """Write the state as it is (at shutdown); a failure is only logged."""
        try:
            await asyncio.to_thread(self.store.save, self._state)
        except StoreError as exc:
            log.error("%s", exc)

    async def append_history(self, record: dict[str, Any]) -> None:
        """Append one finished operation to ``operations.jsonl`` (best effort)."""
        await asyncio.to_thread(self.store.append_history, record)

    async def _save_quietly(self) -> None:
        try:
            await asyncio.to_thread(self.store.save, self._state)
        except StoreError as exc:
            log.error("%s", exc)
            self._warn(str(exc))
