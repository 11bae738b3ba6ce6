"""The persisted levers at start-up, checked against the SGLang of today.

Levers were checked against the SGLang of their day; an upgrade of ``server.python`` may
have renamed or dropped a flag. A set that no longer fits is never launched, and never
lost: the previous copy of the state is tried, the rejected sets are kept in
``state.rejected.json`` (the next save would overwrite them), and ``/status`` names the
file and the levers to fix.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ServerRecord
from sglang_supervisor.sglang.levers import LeverError, LeverSet, check_levers
from sglang_supervisor.sglang.schema import FlagSchema
from sglang_supervisor.store import PREV_FILE, STATE_FILE, PersistedState

log = logging.getLogger("supervisor")


@dataclass
class Choice:
    """What start-up uses: the last-good set and the set to start (None: none fits)."""

    last_good: LeverSet | None = None
    levers: LeverSet | None = None
    #: ``{"state.json last_good": {"levers": ..., "problems": [...]}}`` for each misfit.
    rejected: dict[str, Any] = field(default_factory=dict)
    #: Where what is used came from (for the warning).
    source: str | None = None


def _fit(
    schema: FlagSchema, choice: Choice, where: str, levers: LeverSet | None
) -> LeverSet | None:
    if levers is None:
        return None
    try:
        return check_levers(levers, schema)
    except LeverError as exc:
        choice.rejected[where] = {
            "levers": levers.to_json(),
            "problems": [p.to_json() for p in exc.problems],
        }
        return None


async def choose(parts: Parts, record: ServerRecord, persisted: PersistedState) -> Choice:
    """The persisted last-good and current levers that fit this SGLang: from
    ``state.json``, else (when those do not fit) from its previous copy. Misfits are kept
    and reported (``report``)."""
    choice = Choice()
    choice.last_good = _fit(parts.schema, choice, f"{STATE_FILE} last_good", persisted.last_good)
    current = (
        None
        if choice.last_good
        else _fit(parts.schema, choice, f"{STATE_FILE} levers", persisted.levers)
    )
    choice.source = STATE_FILE if (choice.last_good or current) else None
    if choice.rejected and choice.last_good is None and current is None:
        previous = await parts.journal.load_previous()
        if previous is not None:
            choice.last_good = _fit(
                parts.schema, choice, f"{PREV_FILE} last_good", previous.last_good
            )
            if choice.last_good is None:
                current = _fit(parts.schema, choice, f"{PREV_FILE} levers", previous.levers)
            if choice.last_good or current:
                choice.source = PREV_FILE
    choice.levers = choice.last_good or current
    if choice.rejected:
        await report(parts, record, choice)
    return choice


async def report(parts: Parts, record: ServerRecord, choice: Choice) -> None:
    """Keep the misfits in ``state.rejected.json`` and say in /status which levers of
    which set to fix, where they are kept, and what starts instead."""
    version = parts.schema.sglang_version
    names = sorted({p["lever"] for entry in choice.rejected.values() for p in entry["problems"]})
    rejected = {
        "rejected_at": time.time(),
        "sglang_version": version,
        "sets": choice.rejected,
    }
    kept = await parts.journal.keep_rejected(rejected)
    where = f"kept in {kept}" if kept is not None else "could not be kept (see the next warning)"
    sets = "; ".join(
        f"{what}: " + ", ".join(f"{p['lever']} ({p['message']})" for p in entry["problems"])
        for what, entry in choice.rejected.items()
    )
    if choice.levers is not None:
        instead = f"starting the levers from {choice.source} ({choice.levers.digest()})"
    else:
        instead = "starting the configured levers"
    why = (
        f"persisted levers in {parts.journal.dir} do not fit SGLang {version}: {sets}; they are "
        f"{where}; fix {', '.join(names)} (POST /levers, or the config) — {instead}"
    )
    log.error("%s", why)
    record.warn(why)
