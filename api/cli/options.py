"""The options every command that talks to a daemon shares, and the client they make."""

from __future__ import annotations

import argparse
from pathlib import Path

from sglang_supervisor_api.cli.client import Client
from sglang_supervisor_api.cli.daemon_address import resolve_address
from sglang_supervisor_api.cli.output import err_detail

#: How client commands find the daemon, for ``--help`` (daemon_address says the rule).
ADDRESS_HELP = (
    "Finding the daemon: --url, else $SGLANG_SUPERVISOR_URL, else the daemon's own settings "
    "(the file from --config, $SGLANG_SUPERVISOR_CONFIG or /etc/sglang-supervisor/"
    "config.toml, and $SGLANG_SUPERVISOR_API__HOST/__PORT): [api] host (0.0.0.0 means "
    "127.0.0.1) and port, https when [api] ssl_certfile is set, the token of [api] "
    "token_file; else http://127.0.0.1:8470. -v says which."
)


def add_client_options(p: argparse.ArgumentParser) -> None:
    """``--url``, ``--token``, ``--token-file``, ``--cacert``, ``--config``, ``--json``,
    ``-v``."""
    g = p.add_argument_group("daemon", ADDRESS_HELP)
    g.add_argument(
        "--url",
        help="the daemon's control API (default $SGLANG_SUPERVISOR_URL, else from the "
        "daemon's settings, else http://127.0.0.1:8470)",
    )
    g.add_argument(
        "--token",
        help="bearer token (default $SGLANG_SUPERVISOR_TOKEN, else the daemon's [api] "
        "token_file when the address came from its settings)",
    )
    g.add_argument("--token-file", type=Path, help="read the bearer token from this file")
    g.add_argument(
        "--cacert",
        type=Path,
        metavar="PATH",
        help="with an https URL: trust this PEM certificate (the daemon's, or its CA's) "
        "(default $SGLANG_SUPERVISOR_CACERT, else the daemon's [api] ssl_certfile when the "
        "address came from its settings, else the system's CAs)",
    )
    g.add_argument(
        "--config",
        type=Path,
        metavar="PATH",
        help="the daemon's config file, read for its address and token (default "
        "$SGLANG_SUPERVISOR_CONFIG, else /etc/sglang-supervisor/config.toml when it exists)",
    )
    g.add_argument(
        "--json", action="store_true", help="print the daemon's JSON (nothing else on stdout)"
    )
    g.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="say on stderr which daemon is asked, and where its address and token came from",
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


def add_change_options(p: argparse.ArgumentParser) -> None:
    """``--dry-run`` and ``--drain`` of the commands that change the levers (apply,
    reconcile)."""
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


def client_from_args(args: argparse.Namespace) -> Client:
    """A ``Client`` for ``--url``/``--token``/``--token-file``/``--cacert``/``--config``
    (``sglang_supervisor_api.cli.daemon_address`` says the order). Raises ``ClientError``."""
    address = resolve_address(
        args.url,
        args.token,
        getattr(args, "token_file", None),
        getattr(args, "cacert", None),
        getattr(args, "config", None),
    )
    if getattr(args, "verbose", False):
        err_detail(f"sglang-supervisor: {address.describe()}")
    return Client(
        address.url, token=address.token, cacert=address.cacert, url_from=address.url_from
    )
