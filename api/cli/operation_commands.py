"""Commands that start an operation and follow it live: apply, stop, start, restart; and
``cancel``, which ends one at its next phase boundary. Ctrl-C while following offers the
cancel (on a terminal); the operation otherwise goes on in the daemon."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys

from sglang_supervisor_api.cli.client import Client, Json
from sglang_supervisor_api.cli.client_errors import ClientError, Ended
from sglang_supervisor_api.cli.exits import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    UsageError,
    outcome_exit,
)
from sglang_supervisor_api.cli.follow import OperationFollower
from sglang_supervisor_api.cli.levers_input import lever_changes_from_args
from sglang_supervisor_api.cli.output import err, out, print_json
from sglang_supervisor_api.cli.plan_render import downtime_line
from sglang_supervisor_api.cli.render import lever_changes
from sglang_supervisor_api.cli.render_effect import effect_lines, effect_summary
from sglang_supervisor_api.cli.render_live import log_line, phase_line
from sglang_supervisor_api.cli.text import duration, terminal_width


def cmd_apply(args: argparse.Namespace, client: Client) -> int:
    """Apply a lever change: the daemon validates it with SGLang's parser, checks the
    resources, stops the server, verifies the GPUs released, starts it with the new
    levers and commits them, or rolls back to the last-good ones. Each phase is shown
    as it happens. Exit 0 succeeded, 2 refused (nothing touched), 3 rolled back,
    4 failed, 5 busy."""
    levers, env = lever_changes_from_args(args)
    if not levers and not env and not args.replace:
        raise UsageError("nothing to apply: give --set, --env, --unset or --file")
    if not math.isfinite(args.drain) or args.drain < 0:
        raise UsageError("--drain must be a number of seconds >= 0")
    before = client.levers()
    quiet = args.json
    with OperationFollower(client, None if quiet else out, use_events=not args.poll) as follower:
        if not (args.no_wait or args.dry_run):
            follower.prepare()
        op = client.apply(
            levers,
            env,
            replace=args.replace,
            dry_run=args.dry_run,
            drain_timeout_s=args.drain,
            force_restart=args.force_restart,
            without_router=args.without_router,
            effect_guard=args.effect_guard,
        )
        return dry_run_or_follow(args, client, follower, op, before, "the levers")


def dry_run_or_follow(
    args: argparse.Namespace,
    client: Client,
    follower: OperationFollower,
    op: Json,
    before: Json,
    what: str,
) -> int:
    """An apply's (or a reconcile's) answer: a dry run's checks and what it would change,
    else the operation followed to its end. ``what`` names what was checked."""
    changes = lever_changes(before, op.get("levers_requested") or {})
    if not args.dry_run:
        return follow_operation(args, client, follower, op, changes)
    if args.json:
        print_json(op)
        return outcome_exit(op.get("state"))
    out(f"dry run: {what} were checked; nothing was touched")
    for phase in op.get("phases") or []:
        out(phase_line(phase, 0.0))
    out("would change: " + (", ".join(changes) if changes else "nothing"))
    if op.get("path"):
        out(f"path: {op['path']} ({op.get('path_reason')})")
    for item in op.get("not_run") or []:
        out(f"not checked here: {item.get('check')}: {item.get('reason')}")
    return outcome_exit(op.get("state"))


def cmd_control(args: argparse.Namespace, client: Client) -> int:
    """Stop, start or restart the server, showing each phase as it happens (stop:
    SIGTERM, SIGKILL after the grace period, GPUs verified released). Exit 0 succeeded,
    4 failed, 5 busy."""
    emit = None if args.json else out
    with OperationFollower(client, emit, use_events=not args.poll) as follower:
        if not args.no_wait:
            follower.prepare()
        op = client.control(args.command)
        return follow_operation(args, client, follower, op, None)


def follow_operation(
    args: argparse.Namespace,
    client: Client,
    follower: OperationFollower,
    op: Json,
    changes: list[str] | None,
) -> int:
    """Show the submitted ``op`` until it ends (unless ``--no-wait``); its exit code."""
    op_id = op.get("id")
    if not args.json:
        head = f"{op.get('kind')} {op_id}"
        if changes is not None:
            head += ": " + (", ".join(changes) if changes else "no lever changes (same levers)")
        out(head)
        expected = op.get("expected_downtime")
        if isinstance(expected, dict):
            out(f"expected: {expected['summary']}")
    if args.no_wait:
        if args.json:
            print_json(op)
        else:
            out(f"submitted; follow it with `sglang-supervisor status` (GET /operations/{op_id})")
        return EXIT_OK
    try:
        final = follower.follow(op)
    except KeyboardInterrupt:
        follower.close()
        # The interrupt may have landed inside the HTTP client (a lock taken, a half-read
        # answer): the cancel and what follows go through a new one.
        with client.renewed() as again:
            return _after_interrupt(args, again, str(op_id))
    if args.json:
        print_json(final)
        return outcome_exit(final.get("state"))
    return report_outcome(client, final, terminal_width(), follower.logs.shown)


def _after_interrupt(args: argparse.Namespace, client: Client, op_id: str) -> int:
    """Ctrl-C while following: offer the cancel; when taken, follow the operation to its
    end (its exit code), else exit 130."""
    if not _cancel_on_interrupt(args, client, op_id):
        return EXIT_INTERRUPTED
    emit = None if args.json else out
    with OperationFollower(client, emit, use_events=not args.poll) as follower:
        try:
            final = follower.follow(client.operation(op_id))
        except KeyboardInterrupt:
            err(f"interrupted again: operation {op_id} ends in the daemon")
            return EXIT_INTERRUPTED
    if args.json:
        print_json(final)
        return outcome_exit(final.get("state"))
    return report_outcome(client, final, terminal_width(), follower.logs.shown)


def report_outcome(client: Client, op: Json, width: int, live_log_lines: int = 0) -> int:
    """Print how the operation ended; return its exit code. The failed launch's log tail
    is printed whole, or only its end when its lines were already shown live."""
    state = str(op.get("state"))
    took = duration(op.get("duration_s"))
    down = downtime_line(op)
    if down:
        out(down)
    if state == "succeeded":
        line = f"succeeded in {took}"
        if op.get("kind") in ("apply", "start", "restart"):
            with contextlib.suppress(ClientError):
                srv = client.status().get("server")
                if srv:
                    tokens = srv.get("max_total_num_tokens")
                    line += f": pid {srv.get('pid')} serving"
                    if tokens is not None:
                        line += f", max_total_num_tokens {tokens:,}"
        if op.get("path") in ("live", "weights"):
            what = "changed live" if op["path"] == "live" else "new weights loaded in place"
            line += f" ({what}: no restart)"
        out(line)
        if op.get("effect"):
            out(f"effect: {effect_summary(op.get('effect'))}")
            if op["effect"].get("verdict") == "measuring":
                show = f"sglang-supervisor operations show {op.get('id')}"
                out(f"  (judged when its window closes: {show})")
        return EXIT_OK
    tail = [str(x) for x in op.get("log_tail") or []]
    if state == "rolled_back":
        out(f"rolled back after {took}: {op.get('rollback_reason') or op.get('error')}")
        if op.get("effect"):
            for line in effect_lines(op.get("effect"))[1:]:
                out(line)
        out("the last-good levers serve again")
    else:
        out(f"FAILED after {took}: {op.get('error')}")
    if tail:
        if live_log_lines and len(tail) > 10:
            tail = tail[-10:]
            out("the failed launch's last log lines (more above):")
        else:
            out("the failed launch's last log lines:")
        for line in tail:
            out(log_line(line, width))
    if state != "rolled_back":
        out("see `sglang-supervisor status` for what runs now")
    return outcome_exit(state)


def _cancel_on_interrupt(args: argparse.Namespace, client: Client, op_id: str) -> bool:
    """Ctrl-C while following: on a terminal, offer to cancel the operation; True when it
    was cancelled (and is to be followed to its end)."""
    if args.json or not sys.stdin.isatty():
        err(
            f"interrupted: operation {op_id} goes on in the daemon (`sglang-supervisor status` "
            f"shows it; `sglang-supervisor cancel {op_id}` ends it and rolls back)"
        )
        return False
    try:
        answer = input(
            f"\ninterrupted: cancel operation {op_id}? It ends at its next phase boundary "
            "and rolls back to the last-good levers [y/N] "
        )
    except (EOFError, KeyboardInterrupt):
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        err(f"operation {op_id} goes on in the daemon (`sglang-supervisor status` shows it)")
        return False
    try:
        client.cancel(op_id)
    except Ended as exc:
        if exc.still_running:  # rolling back: the daemon says why it cannot be cancelled
            err(f"not cancelled: {exc}")
        return True  # it ended meanwhile, or ends on its own: follow shows how
    out(f"cancel requested: operation {op_id} ends at its next phase boundary")
    return True


def cmd_cancel(args: argparse.Namespace, client: Client) -> int:
    """Cancel an operation (default: the running one): it ends at its next phase
    boundary (a hung start or a long drain stops waiting) and rolls back to the last-good
    levers; shown as it happens. Exit as the operation ends (3 rolled back, 4 failed, 0
    succeeded), 1 when no operation runs or it had already ended, 7 when the daemon has no
    operation of that id."""
    op_id = args.operation
    if op_id is None:
        running = client.status().get("operation")
        if not isinstance(running, dict) or not running.get("id"):
            raise ClientError("no operation is running: nothing to cancel")
        op_id = str(running["id"])
    emit = None if args.json else out
    with OperationFollower(client, emit, use_events=not args.poll) as follower:
        if not args.no_wait:
            follower.prepare()
        try:
            op = client.cancel(op_id)
        except Ended as exc:
            if args.json:
                print_json(exc.body)
            if exc.still_running:
                err(f"not cancelled: {exc}")
                return EXIT_ERROR
            ended = exc.operation
            err(f"operation {op_id} has already ended: {ended.get('state', 'finished')}")
            return EXIT_ERROR
        return follow_operation(args, client, follower, op, None)
