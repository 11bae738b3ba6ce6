"""Running the daemon: the supervisor, the API under uvicorn, systemd notifications.

``serve`` returns 0 after SIGTERM/SIGINT once the server is stopped and its GPUs are
verified released (or left running in keep-server mode); 1 when the API cannot listen or
the GPUs could not be verified released; 2 on an unsafe or broken configuration (token,
a second daemon on the state dir, an unknown GPU, invalid initial levers).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import logging.handlers
import os
import signal
import sys

import uvicorn

from api.app import create_app
from api.auth import AuthConfigError, check_listen, load_token
from supervisor import sdnotify
from supervisor.config import Settings
from supervisor.engine import Supervisor
from supervisor.process import set_child_subreaper
from supervisor.router import read_api_key
from supervisor.runtime import build_supervisor
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
    # Bounded: refused calls are audited too, and anyone who reaches the port can make them.
    handler = logging.handlers.RotatingFileHandler(
        settings.state_dir / "audit.log", maxBytes=16 << 20, backupCount=3
    )
    handler.setFormatter(logging.Formatter("%(message)s"))
    audit = logging.getLogger("supervisor.audit")
    audit.addHandler(handler)
    audit.setLevel(logging.INFO)


def _lock_state_dir(settings: Settings) -> int:
    """Hold ``<state_dir>/daemon.lock`` for the life of the process: one daemon per state
    directory (a second would tear down the first one's server as a "leftover").

    Raises ``RuntimeError`` naming the pid that holds it.
    """
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    path = settings.state_dir / "daemon.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RuntimeError(
            f"another sglang-supervisor (pid {holder}) already runs on state dir "
            f"{settings.state_dir}; stop it, or give this one its own --state-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


async def _notify_when_listening(server: uvicorn.Server, sup: Supervisor) -> None:
    """READY=1 once the API listens (not tied to the model load), then watchdog pings."""
    while not server.started:
        await asyncio.sleep(0.05)
    sdnotify.notify(f"READY=1\nSTATUS=API listening; server {sup.state}")
    interval = sdnotify.watchdog_interval_s()
    while interval is not None:
        # Sent from the event loop: a blocked loop stops the pings and systemd notices.
        sdnotify.notify("WATCHDOG=1")
        await asyncio.sleep(interval)


async def serve(settings: Settings, log_level: str = "info") -> int:
    """Run the API and the supervisor until SIGTERM/SIGINT.

    In order: the token check, the state-dir lock, the API socket (so a second daemon
    fails before touching anything), the supervisor's start, serving; on a signal, the
    server is stopped and its GPUs verified released (or, with keep_server_on_exit, left
    for the next daemon).
    """
    try:
        token = load_token(settings.api.token_file)
        check_listen(settings.api.host, token)
        read_api_key(settings.router)  # an unreadable router key file stops us here
        _lock_state_dir(settings)
    except (AuthConfigError, RuntimeError) as exc:
        print(f"sglang-supervisor: {exc}", file=sys.stderr)
        return 2
    _audit_to_file(settings)
    # httpx logs every request at INFO: readiness probes and scrapes would flood the log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    sup = build_supervisor(settings)
    app = create_app(
        sup,
        token=token,
        metrics_public=settings.api.metrics_public,
        max_body_bytes=settings.api.max_request_bytes,
    )
    config = uvicorn.Config(
        app,
        host=settings.api.host,
        port=settings.api.port,
        log_level=log_level,
        lifespan="off",
        timeout_graceful_shutdown=5,
        access_log=False,
    )
    try:
        sock = config.bind_socket()
    except SystemExit:  # uvicorn logged why (address in use...)
        print(
            f"sglang-supervisor: cannot listen on {settings.api.host}:{settings.api.port}",
            file=sys.stderr,
        )
        return 1
    set_child_subreaper()

    def on_transition(old: ServerState, new: ServerState, reason: str) -> None:
        sdnotify.notify(f"STATUS=server {new}: {reason[:200]}")

    sup.on_transition.append(on_transition)
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal that stopped it once it returns, with the handler it
    # found installed: make that ours, so a stop by signal still ends with our exit code.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    released = True
    try:
        try:
            await sup.start()
        except ValueError as exc:  # a bad config: unknown GPU, invalid initial levers
            print(f"sglang-supervisor: {exc}", file=sys.stderr)
            return 2
        notifier = asyncio.create_task(_notify_when_listening(server, sup))
        try:
            await server.serve(sockets=[sock])
        finally:
            notifier.cancel()
            budget_us = int(sup.teardown_budget_s() * 1e6)
            sdnotify.notify(
                f"STOPPING=1\nEXTEND_TIMEOUT_USEC={budget_us}\n"
                "STATUS=stopping the server and verifying GPU release"
            )
    finally:
        released = await sup.shutdown(keep_server=keep_server_on_exit(settings))
        sock.close()
    # 1: the server was stopped but its GPUs could not be verified released (see the log).
    return 0 if released else 1
