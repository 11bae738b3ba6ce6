"""``sglang-supervisor operations``: the daemon's recent operations (``GET /operations``),
one of them in detail (``show ID``: its phases with their times from the operation's start,
its lever diff, why it ended as it did, an apply's measured effect), or one followed live
until it ends (``follow ID``, as ``apply`` follows its own).

The lever diff of an apply is what it asked for against the levers in force before it:
its ``levers_before``, recorded by the daemon (the status page shows the same diff). From
a daemon that does not record it: those the previous operation in the daemon's history
left (its ``levers_effective``), ``?`` for an apply older than the history's first.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from sglang_supervisor_api.cli.client import Client, Json
from sglang_supervisor_api.cli.exits import EXIT_OK, UsageError, outcome_exit
from sglang_supervisor_api.cli.follow import OperationFollower, since_start
from sglang_supervisor_api.cli.options import add_client_options
from sglang_supervisor_api.cli.output import err, out, print_json
from sglang_supervisor_api.cli.plan_render import downtime_line
from sglang_supervisor_api.cli.render import lever_changes
from sglang_supervisor_api.cli.render_effect import effect_lines, effect_verdict
from sglang_supervisor_api.cli.render_live import log_line
from sglang_supervisor_api.cli.text import clip, clock, duration, table, terminal_width

#: How many operations the daemon keeps (``GET /operations?limit=`` at most).
HISTORY = 200


def add_operations_parser(sub: Any) -> None:
    """``operations [list|show ID|follow ID]``."""
    p = sub.add_parser(
        "operations",
        help="recent operations; show one (phases, lever diff, reason); follow one live",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=cmd_operations)
    p.add_argument(
        "action",
        nargs="?",
        default="list",
        choices=["list", "show", "follow"],
        help="list (the default), show ID, or follow ID",
    )
    p.add_argument("operation", nargs="?", metavar="ID", help="the operation's id")
    p.add_argument(
        "-n",
        "--limit",
        type=int,
        default=20,
        metavar="N",
        help=f"list: the newest N (at most {HISTORY})",
    )
    p.add_argument(
        "--poll",
        action="store_true",
        help="follow: poll the operation instead of reading the event stream",
    )
    add_client_options(p)


def cmd_operations(args: argparse.Namespace, client: Client) -> int:
    """List, show or follow operations; ``follow`` exits as the operation ended (0, 3
    rolled back, 4 failed)."""
    if args.action == "list":
        if args.operation is not None:
            raise UsageError(f"list takes no id (did you mean `operations show {args.operation}`?)")
        if not 1 <= args.limit <= HISTORY:
            raise UsageError(f"--limit must be between 1 and {HISTORY}")
        return _list(args, client)
    if args.operation is None:
        raise UsageError(f"operations {args.action} needs the operation's id (see `operations`)")
    if args.action == "show":
        return _show(args, client, str(args.operation))
    return _follow(args, client, str(args.operation))


# ------------------------------------------------------------------ the diff


def _levers_before(history: Sequence[Json], op: Json) -> Json | None:
    """The levers in force when ``op`` began: what the daemon recorded with it
    (``levers_before``), else (a daemon too old to record it) those the operation before it
    left (``history`` newest first); None when it is the oldest the daemon keeps."""
    recorded = op.get("levers_before")
    if isinstance(recorded, dict):
        return recorded
    op_id = op.get("id")
    ids = [o.get("id") for o in history]
    if op_id not in ids:
        return None
    for older in history[ids.index(op_id) + 1 :]:
        effective = older.get("levers_effective")
        if isinstance(effective, dict):
            return effective
    return None


def lever_diff(op: Json, before: Json | None) -> list[str] | None:
    """``name old -> new`` for each lever (and env var) an apply changes; [] for the other
    kinds and an apply of the same levers; None when the levers before it are unknown."""
    requested = op.get("levers_requested")
    if op.get("kind") != "apply" or not isinstance(requested, dict):
        return []
    return None if before is None else lever_changes(before, requested)


def _diff_text(diff: list[str] | None, op: Json) -> str:
    if diff is None:
        return "? (the levers before it are older than the daemon's history)"
    if not diff:
        return "same levers" if op.get("kind") == "apply" else "-"
    return ", ".join(diff)


# ------------------------------------------------------------------ list / show


def _list(args: argparse.Namespace, client: Client) -> int:
    ops = client.operations(min(args.limit + 1, HISTORY))  # one more: the first's "before"
    shown = ops[: args.limit]
    if args.json:
        print_json({"operations": shown})
        return EXIT_OK
    if not shown:
        out("no operations yet")
        return EXIT_OK
    rows = []
    for op in shown:
        diff = lever_diff(op, _levers_before(ops, op))
        kind = str(op.get("kind")) + (" (dry run)" if op.get("dry_run") else "")
        rows.append(
            [
                str(op.get("id")),
                kind,
                str(op.get("state")),
                clock(op.get("created_at")),
                duration(op.get("duration_s")) if op.get("duration_s") is not None else "-",
                effect_verdict(op.get("effect")),
                "?" if diff is None else _diff_text(diff, op),
            ]
        )
    width = terminal_width()
    text = table(rows, ["id", "kind", "outcome", "started", "took", "effect", "levers"])
    for line in text.splitlines():
        out(clip(line, width))
    return EXIT_OK


def render_operation(op: Json, diff: list[str] | None) -> list[str]:
    """``operations show``: the head, the lever diff, the reason, each phase with its
    start and end counted from the operation's start, and the failed launch's log tail."""
    state = str(op.get("state"))
    head = f"{op.get('kind')} {op.get('id')}: {state}"
    if op.get("dry_run"):
        head += " (dry run)"
    lines = [head]
    took = duration(op.get("duration_s")) if op.get("duration_s") is not None else "running"
    lines.append(f"  started  {clock(op.get('created_at'))}, took {took}")
    lines.append(f"  levers   {_diff_text(diff, op)}")
    if op.get("path"):
        lines.append(f"  path     {op['path']}: {op.get('path_reason')}")
    reason = op.get("rollback_reason") or op.get("error")
    if reason:
        lines.append(f"  {'reason':<8} {reason}")
    down = downtime_line(op)
    if down:
        lines.append(f"  {down}")
    lines += effect_lines(op.get("effect"))
    phases = op.get("phases") or []
    if phases:
        lines.append("  phases (times from the operation's start):")
        rows = []
        for ph in phases:
            start = since_start(op, ph.get("started_at"))
            end = since_start(op, ph.get("ended_at"))
            rows.append(
                [
                    str(ph.get("name")),
                    str(ph.get("state")),
                    "?" if start is None else f"+{start:.2f}s",
                    "" if end is None else f"-> +{end:.2f}s",
                    duration(ph.get("duration_s")) if ph.get("duration_s") is not None else "",
                    str(ph.get("detail") or ""),
                ]
            )
        lines += table(rows, indent=4).splitlines()
    tail = [str(x) for x in op.get("log_tail") or []]
    if tail:
        lines.append("  the failed launch's last log lines:")
        lines += [log_line(x, terminal_width()) for x in tail]
    return lines


def _show(args: argparse.Namespace, client: Client, op_id: str) -> int:
    op = client.operation(op_id)
    if args.json:
        print_json(op)
        return EXIT_OK
    history = client.operations(HISTORY)
    for line in render_operation(op, lever_diff(op, _levers_before(history, op))):
        out(line)
    return EXIT_OK


# ------------------------------------------------------------------ follow


def _follow(args: argparse.Namespace, client: Client, op_id: str) -> int:
    """Follow ``op_id`` to its end (an ended one is shown whole at once): each phase at its
    time from the operation's start, whenever this follower attached."""
    from sglang_supervisor_api.cli.operation_commands import report_outcome

    emit = None if args.json else out
    with OperationFollower(client, emit, use_events=not args.poll) as follower:
        follower.prepare()  # before reading it: nothing of it is missed
        op = client.operation(op_id)
        if not args.json:
            history = client.operations(HISTORY)
            diff = lever_diff(op, _levers_before(history, op))
            out(f"{op.get('kind')} {op.get('id')}: {_diff_text(diff, op)}")
        try:
            final = follower.follow(op)
        except KeyboardInterrupt:
            err(
                f"interrupted: operation {op_id} goes on in the daemon "
                f"(`sglang-supervisor cancel {op_id}` ends it and rolls back)"
            )
            raise
    if args.json:
        print_json(final)
        return outcome_exit(final.get("state"))
    return report_outcome(client, final, terminal_width(), follower.logs.shown)
