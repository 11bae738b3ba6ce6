"""The options every command that talks to a daemon shares, and the client they make."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

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


#: The prefix of a shared option's dest when it is given before the command
#: (``sglang-supervisor --url URL status``): ``merge_global_options`` moves it over.
GLOBAL_PREFIX = "global_"


def add_client_options(p: argparse.ArgumentParser, *, before_command: bool = False) -> None:
    """``--url``, ``--token``, ``--token-file``, ``--cacert``, ``--config``, ``--json``,
    ``-v``; on the top-level parser (``before_command``) the same options, kept apart
    (``GLOBAL_PREFIX``, no defaults) until ``merge_global_options``."""
    group = p.add_argument_group(
        "daemon",
        "options of every command that talks to a daemon, here or after the command"
        if before_command
        else ADDRESS_HELP,
    )
    g: argparse._ArgumentGroup | _Prefixed = _Prefixed(group) if before_command else group
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


class _Prefixed:
    """An argument group whose options store under ``GLOBAL_PREFIX + dest``, default None:
    the top-level copies of the shared options, so that a subcommand's own defaults can
    never hide one given before it."""

    def __init__(self, group: argparse._ArgumentGroup) -> None:
        self._group = group

    def add_argument(self, *flags: str, **kw: Any) -> argparse.Action:
        dest = next(f for f in flags if f.startswith("--"))[2:].replace("-", "_")
        if kw.get("action") != "store_true":
            kw.setdefault("metavar", dest.upper())
        kw.update(dest=GLOBAL_PREFIX + dest, default=None)
        return self._group.add_argument(*flags, **kw)


def merge_global_options(
    parser: argparse.ArgumentParser,
    command: argparse.ArgumentParser,
    args: argparse.Namespace,
) -> None:
    """Move the shared options given before the command onto its own (``--url URL status``
    is ``status --url URL``); one given after the command wins. An option the command does
    not take (``rollout`` has ``--daemon``, no ``--url``) is a usage error (exit 2),
    never silently dropped."""
    for key, value in sorted(vars(args).items()):
        if not key.startswith(GLOBAL_PREFIX):
            continue
        delattr(args, key)
        if value is None:
            continue
        option = next(a.option_strings[-1] for a in parser._actions if a.dest == key)
        own = next((a for a in command._actions if option in a.option_strings), None)
        if own is None:
            parser.error(
                f"{option} is not an option of `{command.prog}`; give it after the command "
                f"if the command has one (`{command.prog} --help`)"
            )
        if getattr(args, own.dest, own.default) == own.default:
            setattr(args, own.dest, value)


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
