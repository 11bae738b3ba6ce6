"""``sglang-supervisor serve``: run the daemon in the foreground
(``sglang_supervisor_api.daemon.serve``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglang_supervisor_api.daemon_signals import process_signals

if TYPE_CHECKING:
    from sglang_supervisor.config import Settings

DESCRIPTION = (
    "Run the daemon in the foreground: it owns one SGLang server on a fixed set of GPUs "
    "(adopting one it left running, or starting one with the configured levers), serves the "
    "control API, and changes the server's launch flags safely (validate with SGLang's own "
    "parser, drain, stop, verify the GPUs released, relaunch, roll back). SIGTERM or SIGINT "
    "stops it gracefully (the server is stopped and its GPUs verified released, or left "
    "running with keep_server_on_exit); a second one forces the stop (no drain, SIGKILL "
    "now, the release still verified). SIGHUP reloads the token file, the timeouts, "
    "keep_server_on_exit and the log level without touching the server, and the config's "
    '[server.levers]: /status drift follows, and with levers_source = "config" the server '
    "is reconciled to them. Exit 0 stopped "
    "cleanly; 1 the API could not listen or the GPUs could not be verified released; 2 a "
    "configuration it refuses; 3 a state directory it cannot write (systemd does not "
    "restart on 2 or 3)."
)


def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve", help="run the daemon (owns the SGLang server)", description=DESCRIPTION
    )
    p.add_argument("--simulate", action="store_true", help="simulated SGLang server and GPUs")
    p.add_argument("--config", type=Path, help="TOML config file (deploy/config.example.toml)")
    p.add_argument("--host", help="control API address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="control API port (default 8470)")
    p.add_argument("--state-dir", type=Path, help="where levers, history and logs are kept")
    p.add_argument("--server-port", type=int, help="the SGLang server's port (default 30000)")
    p.add_argument("--router-url", help="an sglang-router in front of this server ([router] url)")
    p.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="default: the config's log_level (info); given here, a reload keeps it",
    )
    p.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="the daemon's log lines (uvicorn's too): text, or one JSON object per line; "
        "under systemd each line carries its journald priority",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The config file with the command line's overrides. Raises ``ValueError``."""
    from sglang_supervisor.config import load_settings

    overrides: dict[str, Any] = {
        "api.host": args.host,
        "api.port": args.port,
        "state_dir": str(args.state_dir) if args.state_dir else None,
        "server.port": args.server_port,
        "router.url": args.router_url,
    }
    if args.simulate:
        overrides["simulate"] = True
    return load_settings(args.config, overrides)


def run_serve(args: argparse.Namespace) -> int:
    """Run the daemon until it is stopped; its exit code (see ``sglang_supervisor_api.daemon``)."""
    # First, before the server side's imports: a SIGTERM from now on is recorded and
    # honoured once the daemon runs (``sglang_supervisor_api.cli.main`` may have done it even
    # earlier).
    signals = process_signals()
    signals.install()
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        print(f"sglang-supervisor: {exc}", file=sys.stderr)
        return 2
    from sglang_supervisor_api.auth import AuthConfigError, check_listen, load_token

    try:  # refused at once, before the server side's imports (serve checks again)
        check_listen(settings.api.host, load_token(settings.api.token_file))
    except AuthConfigError as exc:
        print(f"sglang-supervisor: {exc}", file=sys.stderr)
        return 2
    from sglang_supervisor_api.logsetup import setup_logging

    setup_logging(args.log_level or settings.log_level, getattr(args, "log_format", "text"))
    from sglang_supervisor_api.daemon import serve  # the server side, only when serving

    try:
        return run_until_stopped(
            serve(
                settings,
                args.log_level,
                signals=signals,
                load_settings=lambda: settings_from_args(args),
            )
        )
    finally:
        signals.ignore_from_now()  # exiting: a late signal must not change the exit status


#: Name prefix of the daemon's worker threads (``asyncio.to_thread``).
WORKERS = "sglang-supervisor-worker"


def run_until_stopped(daemon: Coroutine[Any, Any, int]) -> int:
    """``asyncio.run(daemon)``, except that a worker thread still blocked at the end (a
    start-up abandoned by SIGTERM while it waited on SGLang's interpreter) is not waited
    for: the daemon has stopped, so the process exits (logs flushed) without it."""
    executor = ThreadPoolExecutor(thread_name_prefix=WORKERS)
    with asyncio.Runner() as runner:
        runner.get_loop().set_default_executor(executor)
        code = runner.run(daemon)
        # Runner.close() waits for every worker of the default executor: give it an idle one.
        runner.get_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
    executor.shutdown(wait=False, cancel_futures=True)
    workers = [t for t in threading.enumerate() if t.name.startswith(WORKERS)]
    for t in workers:
        t.join(timeout=1.0)  # idle workers leave at once
    blocked = [t.name for t in workers if t.is_alive()]
    if blocked:
        logging.getLogger("supervisor").warning(
            "exiting without waiting for %d blocked worker thread(s) of an abandoned start-up: %s",
            len(blocked),
            ", ".join(blocked),
        )
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
