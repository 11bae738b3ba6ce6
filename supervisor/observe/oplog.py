"""One log line per operation end: what ran, how it ended, why, at the level it deserves.

``succeeded`` is INFO, ``rolled_back`` WARNING (the new levers failed; the last-good ones
serve), ``failed`` ERROR (it could not get back to a serving state: an operator is needed).
A crash of a ready server is logged as a WARNING where it is detected; the ``recover``
operation that restarts it ends with a line of its own. The fields are also passed as
``extra`` (``operation_id``, ``kind``, ``outcome``, ``duration_s``), which the JSON log
format (sglang_supervisor_api.logsetup) writes as keys.

Every other line logged while an operation runs says which one, too: the registry binds
the operation to its task (``bind_operation``: a context variable, so the worker threads
it starts with ``asyncio.to_thread`` see it as well), and ``OperationFields``, a filter on
the daemon's log handler, adds its ``operation_id``, ``kind``, the running ``phase`` and
its ``state`` to each record.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

from sglang_supervisor.operations import FAILED, ROLLED_BACK, RUNNING, Operation

log = logging.getLogger("supervisor.operations")

#: The operation the code running now belongs to (its task's context, and so its threads').
_CURRENT: ContextVar[Operation | None] = ContextVar("sglang_supervisor_operation", default=None)


def bind_operation(op: Operation) -> None:
    """Lines logged from here on in this task (and the tasks and threads it starts) are
    ``op``'s. The registry calls it first thing in the operation's task; an apply's
    validate and preflight, which run in the request before it is the running operation,
    are not bound (a refused one never becomes an operation)."""
    _CURRENT.set(op)


def running_phase(op: Operation) -> str | None:
    """The name of ``op``'s phase that runs now (None between phases, or once it ended)."""
    for phase in reversed(op.phases):
        if phase.state == RUNNING:
            return phase.name
    return None


class OperationFields(logging.Filter):
    """Adds the bound operation's ``operation_id``, ``kind``, ``phase`` and ``state`` to a
    record (a field the line passed itself wins); lines outside any operation pass as
    they are."""

    def filter(self, line: logging.LogRecord) -> bool:
        # (Not named "record": that name is the engine's server record, one writer.)
        op = _CURRENT.get()
        if op is None:
            return True
        fields = {
            "operation_id": op.id,
            "kind": str(op.kind),
            "phase": running_phase(op),
            "state": str(op.state),
        }
        for key, value in fields.items():
            if not hasattr(line, key):
                setattr(line, key, value)
        return True


LEVELS: dict[str, int] = {str(ROLLED_BACK): logging.WARNING, str(FAILED): logging.ERROR}


def log_operation_end(op: Operation) -> None:
    """Register on ``Supervisor.on_operation_end``."""
    outcome = str(op.state)
    level = LEVELS.get(outcome, logging.INFO)
    took = "" if op.duration_s is None else f" after {op.duration_s:.1f} s"
    what = "dry run of apply" if op.dry_run else str(op.kind)
    reason = op.rollback_reason or op.error
    if outcome == str(ROLLED_BACK) and op.error and op.error != reason:
        reason = f"{reason}; {op.error}" if reason else op.error
    text = f"operation {op.id} ({what}) {outcome}{took}"
    if reason:
        text += f": {reason}"
    log.log(
        level,
        "%s",
        text,
        extra={
            "operation_id": op.id,
            "kind": str(op.kind),
            "outcome": outcome,
            "duration_s": None if op.duration_s is None else round(op.duration_s, 3),
            "dry_run": op.dry_run,
        },
    )
