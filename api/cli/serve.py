"""``sglang-supervisor serve``: run the daemon in the foreground (``api.daemon.serve``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

from supervisor.config import Settings

DESCRIPTION = (
    "Run the daemon in the foreground: it owns one SGLang server on a fixed set of GPUs "
    "(adopting one it left running, or starting one with the configured levers), serves the "
    "control API, and changes the server's launch flags safely (validate with SGLang's own "
    "parser, drain, stop, verify the GPUs released, relaunch, roll back). SIGTERM or SIGINT "
    "stops it gracefully (the server is stopped and its GPUs verified released, or left "
    "running with keep_server_on_exit). Exit 0 stopped cleanly; 1 the API could not "
    "listen or the GPUs could not be verified released; 2 a configuration it refuses."
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
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The config file with the command line's overrides. Raises ``ValueError``."""
    from supervisor.config import load_settings

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
    """Run the daemon until it is stopped; its exit code (see ``api.daemon``)."""
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        print(f"sglang-supervisor: {exc}", file=sys.stderr)
        return 2
    from api.daemon import serve  # the server side, only when serving

    return asyncio.run(serve(settings, args.log_level))
