"""The config file's levers as the desired state: ``drift`` against the serving set, the
``reconcile`` that applies them, and which set a daemon start launches.

``DesiredLevers`` holds the config's ``[server.levers]``, ``[server.env]`` and
``server.levers_source`` as read at the daemon's start and again on every SIGHUP or
``POST /reconcile`` (``take``), with when they were read and how the last reconcile went;
its own methods are its only writers (on the loop). The settings the daemon started with
are never changed: a re-read config replaces this object's set, not them.

"Serving" is the record's current set (``record.levers``): the levers the server runs,
or, when no server runs (stopped, backoff, failed), the set the next start launches. It
changes only at an operation's commit, so an apply in progress is not drift yet.

A reconcile is an apply of the config's set with ``replace`` semantics: one operation,
validated and preflighted like any apply, and — the server already serving exactly that
set — "nothing changed", no restart (``checks.serving_unchanged``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from sglang_supervisor.config import ServerSettings
from sglang_supervisor.engine.errors import Busy
from sglang_supervisor.engine.record import ServerRecord
from sglang_supervisor.operations import Operation, wall_iso
from sglang_supervisor.redact import REDACTED, redact
from sglang_supervisor.sglang.drift import canonical_config, hides_value, lever_drift
from sglang_supervisor.sglang.levers import LeverError, LeverSet
from sglang_supervisor.sglang.schema import FlagSchema

log = logging.getLogger("supervisor")

SERVING_NO_SERVER = (
    "no server runs: the levers the next start launches (POST /start, or a reconcile)"
)


class DesiredLevers:
    """The config's levers and env (the desired state), ``levers_source``, when they were
    read, and the last reconcile. Written only by its own methods, on the loop."""

    def __init__(self, server: ServerSettings) -> None:
        self.config = LeverSet(dict(server.levers), dict(server.env))
        self.source: str = server.levers_source
        #: When the config was last read (daemon start, SIGHUP, POST /reconcile).
        self.read_at = wall_iso()
        #: ``{"at", "trigger", "outcome", "operation"?, "message"?, "problems"?}``.
        self.last_reconcile: dict[str, Any] | None = None
        #: The /status warning of the last refused reconcile; dropped by the next accepted one.
        self.warning: str | None = None

    def view(self) -> DesiredView:
        """The config's levers now (``SupervisorView.desired``)."""
        last = self.last_reconcile
        return DesiredView(
            config=self.config,
            source=self.source,
            read_at=self.read_at,
            last_reconcile=None if last is None else MappingProxyType(dict(last)),
        )

    def take(self, new: ServerSettings) -> list[str]:
        """Make ``new``'s levers, env and ``levers_source`` the desired state (a SIGHUP or
        ``POST /reconcile`` re-read the config). Returns what changed, for the reload's
        log line. The server is not touched here."""
        changed: list[str] = []
        config = LeverSet(dict(new.levers), dict(new.env))
        moved = self.config.diff(config)
        if moved:
            changed.append("[server.levers]/[server.env] (" + ", ".join(moved) + ")")
        if new.levers_source != self.source:
            changed.append(f"server.levers_source = {new.levers_source}")
        self.config, self.source = config, new.levers_source
        self.read_at = wall_iso()
        return changed

    def reconciled(self, entry: dict[str, Any], warning: str | None) -> str | None:
        """Record a reconcile's outcome (``entry``) and its /status warning (None: it was
        accepted). Returns the previous refusal's warning when it is history now."""
        self.last_reconcile = entry
        if entry.get("dry_run"):
            return None
        dropped, self.warning = self.warning, warning
        return dropped


@dataclass(frozen=True)
class DesiredView:
    """The config's levers as of one instant (in ``SupervisorView.desired``)."""

    config: LeverSet
    source: str
    read_at: str
    last_reconcile: Mapping[str, Any] | None

    def status_json(
        self, serving: LeverSet, schema: FlagSchema, server_pid: int | None
    ) -> dict[str, Any]:
        """``/status``'s ``drift`` (name, config value, serving value; [] when none) and
        ``levers_config`` (where they come from, what "serving" means now, the config's
        problems, the last reconcile)."""
        drift = lever_drift(self.config, serving, schema)
        entries = []
        for e in drift.entries:
            secret = hides_value(e.lever, schema)
            entries.append(
                {
                    "lever": e.lever,
                    "config": REDACTED if secret and e.config is not None else e.config,
                    "serving": REDACTED if secret and e.serving is not None else e.serving,
                }
            )
        serving_means = (
            SERVING_NO_SERVER
            if server_pid is None
            else f"the levers the server runs (pid {server_pid})"
        )
        return {
            "drift": entries,
            "levers_config": {
                "levers_source": self.source,
                "read_at": self.read_at,
                "serving": serving_means,
                "problems": [p.to_json() for p in drift.problems],
                "last_reconcile": None
                if self.last_reconcile is None
                else redact(dict(self.last_reconcile)),
            },
        }


async def reconcile(
    desired: DesiredLevers,
    record: ServerRecord,
    submit: Callable[[LeverSet], Awaitable[Operation]],
    *,
    trigger: str,
    dry_run: bool = False,
) -> Operation:
    """Apply the config's levers (``submit``: an apply with ``replace``: the config's set,
    nothing else) as one operation; nothing to change, nothing restarted. Raises
    ``LeverError`` (refused by validation or preflight: nothing touched) or ``Busy``;
    either is recorded in ``desired.last_reconcile`` (and, unless a dry run, a refusal as a
    /status warning on ``record`` until a reconcile is accepted)."""
    try:
        op = await submit(desired.config)
    except LeverError as exc:
        _record(desired, record, trigger, dry_run, "refused", str(exc), exc.problems)
        raise
    except Busy as exc:
        _record(desired, record, trigger, dry_run, "busy", str(exc))
        raise
    entry = {"at": wall_iso(), "trigger": trigger, "dry_run": dry_run, "outcome": "accepted"}
    entry["operation"] = op.id
    _record_entry(desired, record, entry, None)
    if op.phases:  # the operation says where it came from (its kind stays "apply")
        op.phases[0].detail = f"reconcile ({trigger}): the config's levers; {op.phases[0].detail}"
    return op


def _record(
    desired: DesiredLevers,
    record: ServerRecord,
    trigger: str,
    dry_run: bool,
    outcome: str,
    message: str,
    problems: list[Any] | None = None,
) -> None:
    entry: dict[str, Any] = {
        "at": wall_iso(),
        "trigger": trigger,
        "dry_run": dry_run,
        "outcome": outcome,
        "message": message,
    }
    if problems:
        entry["problems"] = [p.to_json() for p in problems]
    todo = (
        "once it has ended, SIGHUP again (systemctl reload) or `sglang-supervisor reconcile`"
        if outcome == "busy"
        else "fix the config's [server.levers]/[server.env], then SIGHUP (systemctl "
        "reload) or `sglang-supervisor reconcile`"
    )
    warning = f"reconcile ({trigger}) {outcome}: {message}; the server was untouched: {todo}"
    _record_entry(desired, record, entry, warning)


def _record_entry(
    desired: DesiredLevers, record: ServerRecord, entry: dict[str, Any], warning: str | None
) -> None:
    dropped = desired.reconciled(entry, warning)
    if entry["dry_run"]:
        return
    if dropped is not None:
        record.warning_resolved(dropped)  # the last refusal is history now
    if warning is not None:
        log.error("%s", warning)
        record.warn(warning)


def levers_to_start(
    desired: DesiredView,
    schema: FlagSchema,
    persisted: LeverSet | None,
    *,
    adopting: bool,
    warn: Callable[[str], None],
) -> LeverSet:
    """The set a daemon start launches: the persisted one (the last applied) when there
    is one, else the config's. With ``levers_source = "config"`` the config's win, unless
    a server is recorded to be adopted (``adopting``: it keeps what it runs, no reload on a
    daemon upgrade; ``drift`` shows the difference and a SIGHUP reconciles) or they do not
    pass the schema's checks (then the persisted set starts and ``warn`` says why). Raises
    ``ValueError`` when the config's set is needed and invalid."""
    configured, problems = canonical_config(desired.config, schema)
    if desired.source == "config" and persisted is not None:
        if adopting:
            return persisted
        if not problems:
            return configured
        why = "; ".join(f"{p.lever}: {p.message}" for p in problems)
        warn(
            f'levers_source = "config", but the config\'s levers are invalid ({why}): '
            f"started the last applied levers ({persisted.digest()}) instead; fix the "
            "config, then SIGHUP (systemctl reload)"
        )
        return persisted
    if persisted is not None:
        return persisted
    if problems:
        why = "; ".join(f"{p.lever}: {p.message}" for p in problems)
        raise ValueError(
            f"the configured initial levers are invalid: {why}; fix them in the config's "
            "[server.levers]/[server.env], then start the daemon again"
        )
    return configured
