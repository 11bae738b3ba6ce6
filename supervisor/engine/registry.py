"""The operation registry: exactly one operation runs at a time; the last
``MAX_OPERATIONS`` (dry runs included) are kept for ``GET /operations/{id}``; each one that
ends is counted, announced and appended to the history, whatever happened inside it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from sglang_supervisor.engine.boundaries import Cancelled
from sglang_supervisor.engine.errors import Busy
from sglang_supervisor.engine.journal import Journal
from sglang_supervisor.observe.events import EventBus
from sglang_supervisor.observe.oplog import bind_operation
from sglang_supervisor.operations import FAILED, SUCCEEDED, Operation
from sglang_supervisor.phases import OpKind, OpState
from sglang_supervisor.sglang.levers import LeverSet

log = logging.getLogger("supervisor")

#: Operations kept for GET /operations/{id} (dry runs included).
MAX_OPERATIONS = 200


class OperationRegistry:
    """The running operation, the kept ones, and what the metrics count of them."""

    def __init__(
        self,
        events: EventBus,
        journal: Journal,
        contain: Callable[[Operation, Exception], Awaitable[None]],
    ) -> None:
        self.events = events
        self.journal = journal
        #: Called when an operation raised what no step handles (see rollback.contain).
        self.contain = contain
        self.kept: dict[str, Operation] = {}
        self.current: Operation | None = None
        #: The last operation that ended (its error explains a failed start, say).
        self.last: Operation | None = None
        #: Finished operations by (kind, outcome), for the metrics.
        self.counts: dict[tuple[str, str], int] = {}
        #: Unix time of the last apply that succeeded.
        self.last_apply_success_time: float | None = None
        self.on_end: list[Callable[[Operation], None]] = []
        #: The task running ``current`` (awaited by the shutdown, never cancelled midway).
        self.task: asyncio.Task[None] | None = None

    def keep(self, op: Operation) -> None:
        """Keep ``op``; past the cap the oldest *finished* ones go (never a running one)."""
        self.kept[op.id] = op
        if len(self.kept) > MAX_OPERATIONS:
            for old_id in [i for i, o in self.kept.items() if o.finished]:
                if len(self.kept) <= MAX_OPERATIONS:
                    break
                del self.kept[old_id]

    def begin(self, kind: OpKind, requested: LeverSet | None, *, closing: bool) -> Operation:
        """The new running operation; ``Busy`` while another runs or the daemon closes."""
        op = Operation(
            kind=kind, levers_requested=None if requested is None else requested.to_json()
        )
        return self.adopt(op, closing=closing)

    def adopt(self, op: Operation, *, closing: bool) -> Operation:
        """``op``, created before its checks (an apply's validate and preflight ran on it),
        becomes the running operation; ``Busy`` as for ``begin``. The phases it already
        has are announced now, as they ended (nobody could follow it before)."""
        if closing:
            raise Busy(Operation(kind=OpKind.SHUTDOWN))
        current = self.current
        if current is not None and not current.finished:
            raise Busy(current)
        op.listener = self._publish_phase
        op.on_end = self.ended
        self.current = op
        self.keep(op)
        self.events.publish("operation", id=op.id, op_kind=op.kind, state="running")
        for ph in op.phases:
            self._publish_phase(op, ph.to_json())
        return op

    def _publish_phase(self, op: Operation, phase: dict[str, Any]) -> None:
        self.events.publish("phase", operation=op.id, op_kind=op.kind, **phase)

    def run(self, op: Operation, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``op`` as a task; however it ends, it ends finished, counted and recorded."""

        async def runner() -> None:
            bind_operation(op)  # this task's log lines are op's (its own context)
            try:
                await coro
            except Cancelled as exc:  # a shutdown, or a cancel with nothing to roll back
                if not op.finished:
                    op.finish(FAILED, str(exc))
            except asyncio.CancelledError:
                if not op.finished:
                    op.finish(FAILED, "cancelled: the daemon is shutting down")
                raise
            except Exception as exc:  # a bug: never leave the operation or the state hanging
                log.exception("operation %s (%s) crashed", op.id, op.kind)
                if not op.finished:
                    await self.contain(op, exc)
            finally:
                if not op.finished:
                    op.finish(SUCCEEDED)
                self.ended(op)
                try:  # the store already logs a disk error (OSError) and goes on
                    await self.journal.append_history(op.to_json())
                except Exception:  # a bug (a record json cannot write): say so, go on
                    log.exception("operation %s: its history record was not written", op.id)
                if self.current is op:
                    self.current = None

        self.task = asyncio.create_task(runner(), name=f"op-{op.kind}-{op.id}")

    def ended(self, op: Operation) -> None:
        """Count and announce ``op``'s end (once)."""
        if op.reported:
            return
        op.reported = True
        self.last = op
        key = (str(op.kind), str(op.state))
        self.counts[key] = self.counts.get(key, 0) + 1
        if op.kind == OpKind.APPLY and op.state == OpState.SUCCEEDED:
            self.last_apply_success_time = time.time()
        for hook in self.on_end:
            hook(op)
        self.events.publish("operation", id=op.id, op_kind=op.kind, state=op.state, error=op.error)

    def supersede(self, op: Operation, why: str) -> None:
        """End ``op`` now, cancelling its task: only for an operation that is merely
        waiting (a recovery's backoff), never one inside an OS step."""
        if self.task is not None:
            self.task.cancel()
        op.finish(FAILED, why)
        self.current = None
        self.ended(op)
