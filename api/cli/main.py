"""The ``sglang-supervisor`` command: ``serve`` runs the daemon; the rest talk to one.

Client commands share ``--url`` (default ``$SGLANG_SUPERVISOR_URL``, else the daemon's own
settings: ``sglang_supervisor_api.cli.daemon_address``), ``--token`` / ``--token-file``
(default ``$SGLANG_SUPERVISOR_TOKEN``, sent as ``Authorization: Bearer``), ``--config``,
``-v`` and ``--json`` (the daemon's JSON on stdout, nothing else). Exit codes
(``sglang_supervisor_api.cli.exits``): 0 done; 1 the daemon unreachable or another error;
2 refused (invalid levers, bad usage); 3 the change rolled back; 4 the operation failed;
5 another operation is running; 6 the token missing or refused; 7 not found (no such
operation or launch log); 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from sglang_supervisor.version import version
from sglang_supervisor_api.cli.cleanup import add_cleanup_parser, run_cleanup
from sglang_supervisor_api.cli.completion import add_completion_parser, run_completion
from sglang_supervisor_api.cli.exits import EPILOG, EXIT_ERROR
from sglang_supervisor_api.cli.inspect_commands import (
    cmd_events,
    cmd_levers,
    cmd_logs,
    cmd_schema,
    cmd_status,
)
from sglang_supervisor_api.cli.operation_commands import cmd_apply, cmd_cancel, cmd_control
from sglang_supervisor_api.cli.operations_history import add_operations_parser
from sglang_supervisor_api.cli.options import (
    ADDRESS_HELP,
    add_change_options,
    add_client_options,
    add_follow_options,
    merge_global_options,
)
from sglang_supervisor_api.cli.plan import add_plan_parser, run_plan
from sglang_supervisor_api.cli.reconcile import add_reconcile_parser
from sglang_supervisor_api.cli.rollout import add_rollout_parser, run_rollout
from sglang_supervisor_api.cli.runner import ClientCommand, run_client_command
from sglang_supervisor_api.cli.serve import add_serve_parser, run_serve


def _client_parser(
    sub: Any,
    name: str,
    func: ClientCommand,
    help_text: str,
    description: str | None = None,
) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        name, help=help_text, description=description or (func.__doc__ or help_text).strip()
    )
    p.set_defaults(func=func)
    add_client_options(p)
    return p


def _apply_parser(sub: Any) -> None:
    p = _client_parser(sub, "apply", cmd_apply, "change levers: validate, restart, roll back")
    p.add_argument(
        "--set",
        dest="set_",
        action="append",
        default=[],
        metavar="LEVER=VALUE",
        help="a lever (SGLang flag dest name); VALUE reads like TOML: true, 0.9, 8, "
        '"quoted string", [1, 2]; anything else is a string',
    )
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable of the server (NCCL_*, SGLANG_*, CUDA_*, ...)",
    )
    p.add_argument(
        "--unset",
        action="append",
        default=[],
        metavar="LEVER",
        help="remove a lever (back to SGLang's default); env.NAME removes an env var",
    )
    p.add_argument(
        "--file", type=Path, help="a TOML file with [levers] and [env] tables (--set wins)"
    )
    p.add_argument(
        "--replace", action="store_true", help="the given set replaces the current one entirely"
    )
    add_change_options(p)
    p.add_argument(
        "--force-restart",
        action="store_true",
        help="restart the server even when the levers are those it already serves",
    )
    p.add_argument(
        "--without-router",
        action="store_true",
        help="apply although the [router] does not answer (checked before the stop)",
    )
    guard = p.add_mutually_exclusive_group()
    guard.add_argument(
        "--effect-guard",
        dest="effect_guard",
        action="store_const",
        const=True,
        default=None,
        help="commit only once the change's measured effect ([timeouts] effect_window_s) "
        "is no worse than before; roll back to the last-good levers otherwise",
    )
    guard.add_argument(
        "--no-effect-guard",
        dest="effect_guard",
        action="store_const",
        const=False,
        help="commit without waiting for the effect (it is still measured), whatever "
        "[server] effect_guard says",
    )
    add_follow_options(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-supervisor",
        description="Own an SGLang server; change its launch flags safely. " + ADDRESS_HELP,
        epilog=EPILOG,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {version()}", help="print the version"
    )
    add_client_options(parser, before_command=True)
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    _client_parser(sub, "status", cmd_status, "the server's state, levers, GPUs and load")
    _client_parser(sub, "levers", cmd_levers, "current levers beside the last-good ones")
    _apply_parser(sub)
    for name, text in (
        ("stop", "stop the server: SIGTERM, SIGKILL after the grace, verify GPUs released"),
        ("start", "start the server with the current levers"),
        ("restart", "stop, verify GPUs released, start with the same levers"),
    ):
        described = f"{text[0].upper()}{text[1:]}; each phase is shown as it happens. " + (
            "Exit 0 succeeded, 4 failed, 5 busy (another operation runs)."
        )
        add_follow_options(_client_parser(sub, name, cmd_control, text, described))

    p = _client_parser(
        sub, "cancel", cmd_cancel, "end the running operation at its next phase; roll back"
    )
    p.add_argument("operation", nargs="?", help="the operation's id (default: the running one)")
    add_follow_options(p)

    p = _client_parser(sub, "logs", cmd_logs, "the server's log (one file per launch)")
    p.add_argument("-n", "--lines", type=int, default=100, metavar="N", help="last N lines")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    p.add_argument(
        "--launch", type=int, default=0, metavar="K", help="0 = current launch, 1 = previous..."
    )

    p = _client_parser(sub, "schema", cmd_schema, "the installed SGLang's flags")
    p.add_argument("word", nargs="?", help="only flags whose name or help mention WORD")
    p.add_argument(
        "--live",
        action="store_true",
        help="only flags SGLang changes on a running server (an apply of only these: no restart)",
    )

    p = _client_parser(sub, "events", cmd_events, "print the daemon's event stream")
    p.add_argument("--replay", action="store_true", help="start with the recent history")

    add_operations_parser(sub)
    add_plan_parser(sub)
    add_rollout_parser(sub)
    add_reconcile_parser(sub)
    add_cleanup_parser(sub)
    add_completion_parser(sub)
    return parser


def subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of the command ``name``."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command: argparse.ArgumentParser = action.choices[name]
    return command


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    merge_global_options(parser, subcommand(parser, args.command), args)
    if args.command == "serve":
        return run_serve(args)
    if args.command == "cleanup":
        return run_cleanup(args)
    if args.command == "completion":
        return run_completion(parser, args)
    try:
        if args.command == "plan":
            return run_plan(args)
        if args.command == "rollout":
            return run_rollout(args)
        return run_client_command(args, args.func)
    except BrokenPipeError:
        # stdout closed early (`| head`): stop quietly, and keep Python from complaining
        # about the flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
