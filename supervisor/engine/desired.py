"""The config file's levers as the desired state: ``drift`` against the serving set, the
``reconcile`` that applies them, and which set a daemon start launches.

The config's ``[server.levers]``, ``[server.env]`` and ``server.levers_source`` live in
``sup.settings.server``, as read at the daemon's start and again on every SIGHUP or
``POST /reconcile`` (``take_config``). ``DesiredLevers`` keeps what goes with them: when
they were read and how the last reconcile went.

"Serving" is the supervisor's current set (``sup.levers``): the levers the server runs,
or, when no server runs (stopped, backoff, failed), the set the next start launches. It
changes only at an operation's commit, so an apply in progress is not drift yet.

A reconcile is an apply of the config's set with ``replace`` semantics: one operation,
validated and preflighted like any apply, and — the server already serving exactly that
set — "nothing changed", no restart (``checks.serving_unchanged``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from sglang_supervisor.config import ServerSettings
from sglang_supervisor.engine.errors import Busy
from sglang_supervisor.operations import Operation, wall_iso
from sglang_supervisor.redact import REDACTED, is_secret_name, redact
from sglang_supervisor.sglang.drift import canonical_config, lever_drift
from sglang_supervisor.sglang.levers import LeverError, LeverSet

if TYPE_CHECKING:
    from sglang_supervisor.engine.supervisor import Supervisor
    from sglang_supervisor.engine.view import SupervisorView

log = logging.getLogger("supervisor")

SERVING_NO_SERVER = (
    "no server runs: the levers the next start launches (POST /start, or a reconcile)"
)


@dataclass
class DesiredLevers:
    """What goes with the config's levers (their values are ``sup.settings.server``)."""

    #: When the config was last read (daemon start, SIGHUP, POST /reconcile).
    read_at: str = field(default_factory=wall_iso)
    #: ``{"at", "trigger", "outcome", "operation"?, "message"?, "problems"?}``.
    last_reconcile: dict[str, Any] | None = None
    #: The /status warning of the last refused reconcile; dropped by the next accepted one.
    warning: str | None = None


@dataclass(frozen=True)
class DesiredView:
    """The config's levers as of one instant (in ``SupervisorView.desired``)."""

    config: LeverSet
    source: str
    read_at: str
    last_reconcile: Mapping[str, Any] | None

    def status_json(self, view: SupervisorView) -> dict[str, Any]:
        """``/status``'s ``drift`` (name, config value, serving value; [] when none) and
        ``levers_config`` (where they come from, what "serving" means now, the config's
        problems, the last reconcile)."""
        drift = lever_drift(self.config, view.levers, view.schema)
        entries = []
        for e in drift.entries:
            secret = is_secret_name(e.lever)
            entries.append(
                {
                    "lever": e.lever,
                    "config": REDACTED if secret and e.config is not None else e.config,
                    "serving": REDACTED if secret and e.serving is not None else e.serving,
                }
            )
        serving_means = (
            SERVING_NO_SERVER
            if view.server is None
            else f"the levers the server runs (pid {view.server.pid})"
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


def snapshot(sup: Supervisor) -> DesiredView:
    """The config's levers now (on the loop: ``take_config`` writes them there)."""
    s = sup.settings.server
    last = sup.desired.last_reconcile
    return DesiredView(
        config=LeverSet(dict(s.levers), dict(s.env)),
        source=s.levers_source,
        read_at=sup.desired.read_at,
        last_reconcile=None if last is None else MappingProxyType(dict(last)),
    )


def take_config(sup: Supervisor, new: ServerSettings) -> list[str]:
    """Make ``new``'s levers, env and ``levers_source`` the desired state (a SIGHUP or
    ``POST /reconcile`` re-read the config); call it on the loop. Returns what changed,
    for the reload's log line. The server is not touched here."""
    running = sup.settings.server
    changed: list[str] = []
    moved = LeverSet(running.levers, running.env).diff(LeverSet(new.levers, new.env))
    if moved:
        changed.append("[server.levers]/[server.env] (" + ", ".join(moved) + ")")
    if new.levers_source != running.levers_source:
        changed.append(f"server.levers_source = {new.levers_source}")
    running.levers, running.env = dict(new.levers), dict(new.env)
    running.levers_source = new.levers_source
    sup.desired.read_at = wall_iso()
    return changed


async def reconcile(
    sup: Supervisor, *, trigger: str, dry_run: bool = False, drain_timeout_s: float = 0.0
) -> Operation:
    """Apply the config's levers (``replace``: the config's set, nothing else) as one
    operation; nothing to change, nothing restarted. Raises ``LeverError`` (refused by
    validation or preflight: nothing touched) or ``Busy``; either is recorded in
    ``last_reconcile`` (and a refusal as a /status warning until a reconcile is accepted).
    """
    s = sup.settings.server
    try:
        op = await sup.submit_apply(
            s.levers, s.env, replace=True, dry_run=dry_run, drain_timeout_s=drain_timeout_s
        )
    except LeverError as exc:
        _record(sup, trigger, dry_run, "refused", message=str(exc), problems=exc.problems)
        raise
    except Busy as exc:
        _record(sup, trigger, dry_run, "busy", message=str(exc))
        raise
    _record(sup, trigger, dry_run, "accepted", operation=op.id)
    if op.phases:  # the operation says where it came from (its kind stays "apply")
        op.phases[0].detail = f"reconcile ({trigger}): the config's levers; {op.phases[0].detail}"
    return op


def _record(
    sup: Supervisor,
    trigger: str,
    dry_run: bool,
    outcome: str,
    *,
    operation: str | None = None,
    message: str | None = None,
    problems: list[Any] | None = None,
) -> None:
    entry: dict[str, Any] = {
        "at": wall_iso(),
        "trigger": trigger,
        "dry_run": dry_run,
        "outcome": outcome,
    }
    if operation is not None:
        entry["operation"] = operation
    if message is not None:
        entry["message"] = message
    if problems:
        entry["problems"] = [p.to_json() for p in problems]
    sup.desired.last_reconcile = entry
    if dry_run:
        return
    d = sup.desired
    if d.warning is not None and d.warning in sup.warnings:
        sup.warnings.remove(d.warning)  # the last refusal is history now
        d.warning = None
    if outcome != "accepted":
        todo = (
            "once it has ended, SIGHUP again (systemctl reload) or `sglang-supervisor reconcile`"
            if outcome == "busy"
            else "fix the config's [server.levers]/[server.env], then SIGHUP (systemctl "
            "reload) or `sglang-supervisor reconcile`"
        )
        d.warning = f"reconcile ({trigger}) {outcome}: {message}; the server was untouched: {todo}"
        log.error("%s", d.warning)
        sup.warn(d.warning)


def levers_to_start(sup: Supervisor, persisted: LeverSet | None) -> LeverSet:
    """The set a daemon start launches: the persisted one (the last applied) when there
    is one, else the config's. With ``levers_source = "config"`` the config's win, unless
    a server is recorded to be adopted (it keeps what it runs: no reload on a daemon
    upgrade; ``drift`` shows the difference and a SIGHUP reconciles) or they do not pass
    the schema's checks (then the persisted set starts and /status says why). Raises
    ``ValueError`` when the config's set is needed and invalid."""
    s = sup.settings.server
    configured, problems = canonical_config(LeverSet(s.levers, s.env), sup.schema)
    if s.levers_source == "config" and persisted is not None:
        if sup.journal.recorded.server is not None:
            return persisted
        if not problems:
            return configured
        why = "; ".join(f"{p.lever}: {p.message}" for p in problems)
        sup.warn(
            f'levers_source = "config", but the config\'s levers are invalid ({why}): '
            f"started the last applied levers ({persisted.digest()}) instead; fix the "
            "config, then SIGHUP (systemctl reload)"
        )
        return persisted
    if persisted is not None:
        return persisted
    if problems:
        why = "; ".join(f"{p.lever}: {p.message}" for p in problems)
        raise ValueError(f"the configured initial levers are invalid: {why}")
    return configured
