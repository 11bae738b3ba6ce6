"""The ``sglang-supervisor`` command: ``serve`` runs the daemon; the rest talk to one."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from supervisor.config import Settings, load_settings

log = logging.getLogger("supervisor")


def _serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the daemon (owns the SGLang server)")
    p.add_argument("--simulate", action="store_true", help="simulated SGLang server and GPUs")
    p.add_argument("--config", type=Path, help="TOML config file (deploy/config.example.toml)")
    p.add_argument("--host", help="control API address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="control API port (default 8470)")
    p.add_argument("--state-dir", type=Path, help="where levers, history and logs are kept")
    p.add_argument("--server-port", type=int, help="the SGLang server's port (default 30000)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sglang-supervisor",
        description="Own an SGLang server; change its launch flags safely.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    return parser


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {
        "api.host": args.host,
        "api.port": args.port,
        "state_dir": str(args.state_dir) if args.state_dir else None,
        "server.port": args.server_port,
    }
    if args.simulate:
        overrides["simulate"] = True
    return load_settings(args.config, overrides)


async def serve(settings: Settings, log_level: str = "info") -> int:
    """Run the API and the supervisor until SIGTERM/SIGINT; then stop the server, verify
    the GPUs released, and return 0 (1 when start-up failed)."""
    import uvicorn

    from api.app import create_app
    from supervisor.process import set_child_subreaper
    from supervisor.runtime import build_supervisor

    sup = build_supervisor(settings)
    set_child_subreaper()
    app = create_app(sup)
    config = uvicorn.Config(
        app,
        host=settings.api.host,
        port=settings.api.port,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=5,
        access_log=False,
    )
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal that stopped it once it returns, with the handler it
    # found installed: make that ours, so a stop by signal still ends with exit code 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        await server.serve()
    finally:
        # A second Ctrl-C makes uvicorn skip the lifespan shutdown: never leave the
        # server behind because of that. shutdown() is idempotent.
        await sup.shutdown()
    return 0 if server.started else 1


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        logging.basicConfig(
            level=getattr(logging, args.log_level.upper()),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        try:
            settings = settings_from_args(args)
        except ValueError as exc:
            print(f"sglang-supervisor: {exc}", file=sys.stderr)
            return 2
        return asyncio.run(serve(settings, args.log_level))
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
