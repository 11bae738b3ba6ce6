"""``sglang-supervisor reconcile``: apply the daemon's config file's levers (its
``[server.levers]`` and ``[server.env]``) as one operation.

The daemon reads its own config (``POST /reconcile``): this command may run on another
host. The drift (``GET /status``) says what will change; a server that already serves
the config's levers is not restarted. Output and following are ``apply``'s.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from sglang_supervisor_api.cli.client import Client
from sglang_supervisor_api.cli.exits import UsageError, outcome_exit
from sglang_supervisor_api.cli.follow import OperationFollower
from sglang_supervisor_api.cli.operation_commands import follow_operation
from sglang_supervisor_api.cli.options import add_client_options, add_follow_options
from sglang_supervisor_api.cli.output import out, print_json
from sglang_supervisor_api.cli.render import lever_changes
from sglang_supervisor_api.cli.render_live import phase_line

HELP = "apply the daemon's config file's levers; nothing to change, no restart"


def add_reconcile_parser(sub: Any) -> None:
    """Register ``reconcile`` (its options: ``--dry-run``, ``--drain``, follow options)."""
    p = sub.add_parser("reconcile", help=HELP, description=(cmd_reconcile.__doc__ or HELP))
    p.set_defaults(func=cmd_reconcile)
    add_client_options(p)
    p.add_argument(
        "--dry-run", action="store_true", help="validate and preflight only; touch nothing"
    )
    p.add_argument(
        "--drain",
        type=float,
        default=0.0,
        metavar="S",
        help="first wait up to S seconds for running and queued requests to finish",
    )
    add_follow_options(p)


def cmd_reconcile(args: argparse.Namespace, client: Client) -> int:
    """Make the server run the levers of the daemon's config file: the daemon re-reads
    it and applies its [server.levers] and [server.env] (replacing the current set) as
    one operation — validate, preflight, stop, verify the GPUs released, start, commit,
    or roll back. Nothing differs: succeeded, no restart. Exit 0 succeeded, 2 refused
    (nothing touched), 3 rolled back, 4 failed, 5 busy."""
    if not math.isfinite(args.drain) or args.drain < 0:
        raise UsageError("--drain must be a number of seconds >= 0")
    before = client.levers()
    quiet = args.json
    with OperationFollower(client, None if quiet else out, use_events=not args.poll) as follower:
        if not (args.no_wait or args.dry_run):
            follower.prepare()
        op = client.reconcile(dry_run=args.dry_run, drain_timeout_s=args.drain)
        changes = lever_changes(before, op.get("levers_requested") or {})
        if args.dry_run:
            if quiet:
                print_json(op)
                return outcome_exit(op.get("state"))
            out("dry run: the config's levers were checked; nothing was touched")
            for phase in op.get("phases") or []:
                out(phase_line(phase, 0.0))
            out("would change: " + (", ".join(changes) if changes else "nothing"))
            for item in op.get("not_run") or []:
                out(f"not checked here: {item.get('check')}: {item.get('reason')}")
            return outcome_exit(op.get("state"))
        return follow_operation(args, client, follower, op, changes)
