"""One log line per operation end: what ran, how it ended, why, at the level it deserves.

``succeeded`` is INFO, ``rolled_back`` WARNING (the new levers failed; the last-good ones
serve), ``failed`` ERROR (it could not get back to a serving state: an operator is needed).
A crash of a ready server is logged as a WARNING where it is detected; the ``recover``
operation that restarts it ends with a line of its own. The fields are also passed as
``extra`` (``operation_id``, ``kind``, ``outcome``, ``duration_s``), which the JSON log
format (sglang_supervisor_api.logsetup) writes as keys.
"""

from __future__ import annotations

import logging

from sglang_supervisor.operations import FAILED, ROLLED_BACK, Operation

log = logging.getLogger("supervisor.operations")

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
