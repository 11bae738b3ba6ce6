"""Running a client command: the client from the options, and every failure turned into a
one-line message and an exit code (``sglang_supervisor_api.cli.exits``), the same for every
command."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable

from sglang_supervisor_api.cli.client import Client
from sglang_supervisor_api.cli.client_errors import Busy, ClientError, Invalid
from sglang_supervisor_api.cli.exits import (
    EXIT_BUSY,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    UsageError,
    error_exit,
)
from sglang_supervisor_api.cli.options import client_from_args
from sglang_supervisor_api.cli.output import err, err_detail, print_json
from sglang_supervisor_api.cli.render import running_operation

ClientCommand = Callable[[argparse.Namespace, Client], int]


def run_client_command(args: argparse.Namespace, func: ClientCommand) -> int:
    """Run ``func(args, client)``; returns its exit code, or the failure's."""
    try:
        with client_from_args(args) as client:
            try:
                return func(args, client)
            except Busy as exc:
                return report_busy(args, client, exc)
    except UsageError as exc:
        err(str(exc))
        return EXIT_INVALID
    except Invalid as exc:
        if args.json:
            print_json(exc.body)
        err(str(exc) if exc.problems else f"refused: {exc}")
        for lever, message in exc.problems:
            err_detail(f"  {lever}: {message}")
        return EXIT_INVALID
    except ClientError as exc:
        err(str(exc))
        return error_exit(exc)
    except KeyboardInterrupt:
        err_detail("")
        return EXIT_INTERRUPTED


def report_busy(args: argparse.Namespace, client: Client, exc: Busy) -> int:
    """Another operation runs: say which (asking the daemon), exit 5."""
    if args.json:
        print_json(exc.body)
    what = str(exc)
    if exc.operation_id:
        with contextlib.suppress(ClientError):
            what = "busy: " + running_operation(client.operation(exc.operation_id))
            what += " (wait for it, or watch it with `sglang-supervisor events`)"
    err(what)
    return EXIT_BUSY
