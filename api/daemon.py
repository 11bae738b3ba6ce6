"""Running the daemon: the supervisor, the API under uvicorn, systemd notifications.

``serve`` returns 0 after SIGTERM/SIGINT once the server is stopped and its GPUs are
verified released; 1 when start-up failed; 2 on an unsafe or broken configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys

from api.auth import AuthConfigError, check_listen, load_token
from supervisor import sdnotify
from supervisor.config import Settings
from supervisor.states import ServerState

log = logging.getLogger("supervisor")


KEEP_SERVER_ENV = "SGLANG_SUPERVISOR_KEEP_SERVER"


def keep_server_on_exit(settings: Settings) -> bool:
    """Whether the daemon's exit leaves the server running (the KillMode=process drop-in)."""
    env = os.environ.get(KEEP_SERVER_ENV, "").strip().lower()
    if env:
        return env in ("1", "true", "yes")
    return settings.keep_server_on_exit


def _audit_to_file(settings: Settings) -> None:
    """Mutating calls also go to ``<state_dir>/audit.log`` (JSON lines)."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(settings.state_dir / "audit.log")
    handler.setFormatter(logging.Formatter("%(message)s"))
    audit = logging.getLogger("supervisor.audit")
    audit.addHandler(handler)
    audit.setLevel(logging.INFO)


async def _notify_when_listening(server: object, sup_state: list[str]) -> None:
    """READY=1 once the API listens (not tied to the model load), then watchdog pings."""
    while not getattr(server, "started", False):
        await asyncio.sleep(0.05)
    sdnotify.notify(f"READY=1\nSTATUS=API listening; server {sup_state[0]}")
    interval = sdnotify.watchdog_interval_s()
    while interval is not None:
        # Sent from the event loop: a blocked loop stops the pings and systemd notices.
        sdnotify.notify("WATCHDOG=1")
        await asyncio.sleep(interval)


async def serve(settings: Settings, log_level: str = "info") -> int:
    """Run the API and the supervisor until SIGTERM/SIGINT."""
    import uvicorn

    from api.app import create_app
    from supervisor.process import set_child_subreaper
    from supervisor.runtime import build_supervisor

    try:
        token = load_token(settings.api.token_file)
        check_listen(settings.api.host, token)
    except AuthConfigError as exc:
        print(f"sglang-supervisor: {exc}", file=sys.stderr)
        return 2
    _audit_to_file(settings)
    sup = build_supervisor(settings)
    set_child_subreaper()
    state = [str(ServerState.STOPPED)]

    def on_transition(old: ServerState, new: ServerState, reason: str) -> None:
        state[0] = str(new)
        sdnotify.notify(f"STATUS=server {new}: {reason[:200]}")

    sup.on_transition.append(on_transition)
    app = create_app(
        sup,
        token=token,
        metrics_public=settings.api.metrics_public,
        max_body_bytes=settings.api.max_request_bytes,
        keep_server=keep_server_on_exit(settings),
    )
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
    notifier = asyncio.create_task(_notify_when_listening(server, state))
    keep = keep_server_on_exit(settings)
    try:
        await server.serve()
    finally:
        notifier.cancel()
        budget_us = int(sup.teardown_budget_s() * 1e6)
        sdnotify.notify(
            f"STOPPING=1\nEXTEND_TIMEOUT_USEC={budget_us}\n"
            "STATUS=stopping the server and verifying GPU release"
        )
        # A second Ctrl-C makes uvicorn skip the lifespan shutdown: never leave the
        # server behind because of that. shutdown() is idempotent.
        await sup.shutdown(keep_server=keep)
        with contextlib.suppress(asyncio.CancelledError):
            await notifier
    return 0 if server.started else 1
