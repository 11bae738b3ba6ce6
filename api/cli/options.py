"""The options every command that talks to a daemon shares, and the client they make."""

from __future__ import annotations

import argparse
from pathlib import Path

from sglang_supervisor_api.cli.client import Client, resolve_token, resolve_url
from sglang_supervisor_api.cli.tls import resolve_cacert


def add_client_options(p: argparse.ArgumentParser) -> None:
    """``--url``, ``--token``, ``--token-file``, ``--cacert``, ``--json``."""
    g = p.add_argument_group("daemon")
    g.add_argument(
        "--url",
        help="the daemon's control API (default $SGLANG_SUPERVISOR_URL or http://127.0.0.1:8470)",
    )
    g.add_argument("--token", help="bearer token (default $SGLANG_SUPERVISOR_TOKEN)")
    g.add_argument("--token-file", type=Path, help="read the bearer token from this file")
    g.add_argument(
        "--cacert",
        type=Path,
        metavar="PATH",
        help="with an https URL: trust this PEM certificate (the daemon's, or its CA's) "
        "(default $SGLANG_SUPERVISOR_CACERT, else the system's CAs)",
    )
    g.add_argument(
        "--json", action="store_true", help="print the daemon's JSON (nothing else on stdout)"
    )


def add_follow_options(p: argparse.ArgumentParser) -> None:
    """``--no-wait`` and ``--poll`` of the commands that start an operation."""
    p.add_argument(
        "--no-wait", action="store_true", help="print the operation id and return at once"
    )
    p.add_argument(
        "--poll",
        action="store_true",
        help="follow by polling the operation instead of the event stream "
        "(for proxies that buffer server-sent events)",
    )


def client_from_args(args: argparse.Namespace) -> Client:
    """A ``Client`` for ``--url``/``--token``/``--token-file``/``--cacert``. Raises
    ``ClientError``."""
    token = resolve_token(args.token, getattr(args, "token_file", None))
    cacert = resolve_cacert(getattr(args, "cacert", None))
    return Client(resolve_url(args.url), token=token, cacert=cacert)
