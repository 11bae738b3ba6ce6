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
from sglang_supervisor_api.cli.exits import UsageError
from sglang_supervisor_api.cli.follow import OperationFollower
from sglang_supervisor_api.cli.operation_commands import dry_run_or_follow
from sglang_supervisor_api.cli.options import (
    add_change_options,
    add_client_options,
    add_follow_options,
)
from sglang_supervisor_api.cli.output import out

HELP = "apply the daemon's config file's levers; nothing to change, no restart"


def add_reconcile_parser(sub: Any) -> None:
    """Register ``reconcile`` (its options: ``--dry-run``, ``--drain``, follow options)."""
    p = sub.add_parser("reconcile", help=HELP, description=(cmd_reconcile.__doc__ or HELP))
    p.set_defaults(func=cmd_reconcile)
    add_client_options(p)
    add_change_options(p)
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
        return dry_run_or_follow(args, client, follower, op, before, "the config's levers")
