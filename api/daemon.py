"""Running the daemon: the supervisor, the API under uvicorn, signals, systemd notifications.

``serve`` returns 0 after SIGTERM/SIGINT once the server is stopped and its GPUs are
verified released (or left running in keep-server mode); 1 when the API cannot listen or
the GPUs could not be verified released; 2 on an unsafe or broken configuration (token,
a second daemon on the state dir, an unknown GPU, invalid initial levers); 3
(``EXIT_STATE_DIR``) when the state directory cannot be written (read-only file system,
permissions, a full disk). The unit does not restart on 2 or 3
(``RestartPreventExitStatus=2 3``): neither fixes itself.

Signals (``sglang_supervisor_api.daemon_signals`` records them from the process's first instant):
the first SIGTERM or SIGINT stops gracefully, at any point (while starting too); SIGHUP reloads what
can change without touching the server (``sglang_supervisor_api.reload``). uvicorn's own signal
handling is off: the daemon decides, and stops uvicorn itself (``should_exit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import logging.handlers
import os
import sys
from collections.abc import Callable
from pathlib import Path

import uvicorn

from sglang_supervisor.config import Settings, instance_name
from sglang_supervisor.diskspace import describe_os_error
from sglang_supervisor.engine import Supervisor
from sglang_supervisor.host import sdnotify
from sglang_supervisor.host.process import set_child_subreaper
from sglang_supervisor.runtime import build_supervisor, cleanup
from sglang_supervisor.sglang.router import read_api_key
from sglang_supervisor.slurm.allocation import require_allocation, share_of
from sglang_supervisor.states import ServerState
from sglang_supervisor_api.app import close_streams, create_app
from sglang_supervisor_api.audit import flush_suppressed
from sglang_supervisor_api.audit_file import _audit_to_file
from sglang_supervisor_api.auth import AuthConfigError, load_tokens
from sglang_supervisor_api.daemon_signals import DaemonSignals, process_signals
from sglang_supervisor_api.instance_lock import InstanceBusy, accept_and_close, hold_instance
from sglang_supervisor_api.listener import ApiServer, first_request_within, listen_socket
from sglang_supervisor_api.logsetup import UVICORN_LOG_CONFIG
from sglang_supervisor_api.reconcile import on_sighup
from sglang_supervisor_api.reload import Reloader
from sglang_supervisor_api.server_journal import server_log_forwarder
from sglang_supervisor_api.slurm_daemon import (
    EXIT_ALLOCATION_UNUSABLE,
    watch_allocation,
)
from sglang_supervisor_api.state_lock import StateDirBusy, lock_state_dir
from sglang_supervisor_api.stopping import Stopping
from sglang_supervisor_api.tls import check_tls

log = logging.getLogger("supervisor")


KEEP_SERVER_ENV = "SGLANG_SUPERVISOR_KEEP_SERVER"
#: The state directory cannot be written: one line on stderr, and systemd does not
#: restart (systemd/sglang-supervisor.service: RestartPreventExitStatus).
EXIT_STATE_DIR = 3


def state_dir_unusable(settings: Settings, exc: OSError) -> str:
    """One line naming the state directory, the file and the disk, and what to do."""
    where = Path(exc.filename) if exc.filename else settings.state_dir
    return (
        f"sglang-supervisor: cannot write the state directory {settings.state_dir} "
        f"({describe_os_error(where, exc)}); it holds the levers, the lock and the logs: "
        "make it writable (or pass --state-dir), then start the daemon again"
    )


def keep_server_on_exit(settings: Settings) -> bool:
    """Whether the daemon's exit leaves the server running (the KillMode=process drop-in)."""
    env = os.environ.get(KEEP_SERVER_ENV, "").strip().lower()
    if env:
        return env in ("1", "true", "yes")
    return settings.keep_server_on_exit


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


async def _start(sup: Supervisor, stopping: Stopping) -> bool:
    """``sup.start()``, unless a stop is asked for first: then the start-up (reading the
    state, the schema, the GPUs: nothing launched yet) is abandoned and False returned.
    Raises ``ValueError`` (a bad config) from the start."""
    start = asyncio.ensure_future(sup.start())
    stop = asyncio.ensure_future(stopping.requested.wait())
    try:
        await asyncio.wait({start, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if not start.done():
        log.info("stopped while starting: the start-up is abandoned (nothing was launched)")
        start.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await start
        return False
    start.result()
    return True


async def _start_beside_api(
    sup: Supervisor, stopping: Stopping, server: uvicorn.Server
) -> str | None:
    """``_start`` while the API serves: on a bad config (``ValueError``) the API stops
    and the reason is returned (the daemon exits 2); None otherwise."""
    try:
        await _start(sup, stopping)
    except ValueError as exc:
        server.should_exit = True
        return str(exc)
    except BaseException:
        server.should_exit = True  # the API does not serve on without a supervisor
        raise
    return None


async def _stop_leftovers(settings: Settings, sup: Supervisor) -> bool:
    """``runtime.cleanup`` at exit, once the supervisor's own teardown has ended: the
    daemon leaves nothing of its instance running, not even a server it had not adopted
    yet when a stop came during start-up. A forced stop (now, or during its grace
    period) SIGKILLs at once. False when something survived."""
    report = await asyncio.to_thread(
        cleanup,
        settings,
        forced=sup.shutdown_forced,
        cut_grace=lambda: sup.shutdown_forced,
    )
    if report.members:
        log.warning("stopped processes of this instance: %s", report.describe())
    return report.clean


async def serve(
    settings: Settings,
    log_level: str | None = None,
    *,
    signals: DaemonSignals | None = None,
    load_settings: Callable[[], Settings] | None = None,
) -> int:
    """Run the API and the supervisor until SIGTERM/SIGINT.

    In order: the token and TLS checks, the state-dir lock, the instance (host-wide: exit 2
    naming the daemon that owns it, before any process is touched), the API socket (so
    a second daemon fails before touching anything), then serving, with the supervisor's
    start beside it (mutating calls answer 503 until it has read the state, schema and
    GPUs); on a signal (at any point: ``signals`` has recorded them since the process
    began), the server is
    stopped and its GPUs verified released (or, with keep_server_on_exit, left for the
    next daemon). ``load_settings`` re-reads the config on SIGHUP; ``log_level`` given
    (``--log-level``) wins over the config's.
    """
    if signals is None:
        signals = process_signals()
        signals.install()
    try:
        token, read_token = load_tokens(settings.api, settings.api.host)
        check_tls(settings.api)
        read_api_key(settings.router)  # an unreadable router key file stops us here
        if settings.server.launcher == "slurm":  # NotInAllocation is a RuntimeError
            share_of(require_allocation(settings.slurm.scontrol), settings.slurm)
        state_fd = lock_state_dir(settings.state_dir)
    except OSError as exc:  # read-only, not ours, full: no traceback, no restart loop
        print(state_dir_unusable(settings, exc), file=sys.stderr)
        return EXIT_STATE_DIR
    except StateDirBusy as exc:
        print(
            f"sglang-supervisor: {exc}; stop it, or give this one its own --state-dir",
            file=sys.stderr,
        )
        return 2
    except (AuthConfigError, RuntimeError) as exc:
        print(f"sglang-supervisor: {exc}", file=sys.stderr)
        return 2
    try:
        # Host-wide, before anything of this instance is touched: a daemon whose state dir
        # was deleted, or another state dir with the same instance, still owns it.
        owned = hold_instance(instance_name(settings))
    except InstanceBusy as exc:
        print(f"sglang-supervisor: {exc}", file=sys.stderr)
        os.close(state_fd)
        return 2
    loop = asyncio.get_running_loop()
    loop.add_reader(owned.fileno(), accept_and_close, owned)
    try:
        return await _serve_owned(
            settings, token, log_level, signals, load_settings, read_token=read_token
        )
    finally:
        loop.remove_reader(owned.fileno())
        owned.close()


async def _serve_owned(
    settings: Settings,
    token: str | None,
    log_level: str | None,
    signals: DaemonSignals,
    load_settings: Callable[[], Settings] | None,
    *,
    read_token: str | None = None,
) -> int:
    """``serve`` once the state dir and the instance are this process's."""
    audit_writer = _audit_to_file(settings)
    # httpx logs every request at INFO: readiness probes and scrapes would flood the log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    sup = build_supervisor(settings)
    app = create_app(
        sup,
        token=token,
        read_token=read_token,
        metrics_public=settings.api.metrics_public,
        max_body_bytes=settings.api.max_request_bytes,
        body_timeout_s=settings.api.body_timeout_s,
        bind_host=settings.api.host,
        allowed_hosts=tuple(settings.api.allowed_hosts),
    )
    config = uvicorn.Config(
        app,
        host=settings.api.host,
        port=settings.api.port,
        log_level=log_level or settings.log_level,
        lifespan="off",
        # The audit log names the socket's peer, never an X-Forwarded-For header.
        proxy_headers=False,
        timeout_graceful_shutdown=5,
        # Bounded: each connection may hold a body of max_request_bytes (body_limits.py).
        limit_concurrency=settings.api.max_connections,
        # A connection must begin its request within body_timeout_s (idle ones held slots).
        http=first_request_within(settings.api.body_timeout_s),
        access_log=False,
        # uvicorn's lines go through sglang_supervisor_api.logsetup's handler
        log_config=UVICORN_LOG_CONFIG,
        # TLS by uvicorn itself ([api] ssl_*; None: plain HTTP), checked by check_tls.
        ssl_certfile=settings.api.ssl_certfile,
        ssl_keyfile=settings.api.ssl_keyfile,
    )
    try:
        sock = listen_socket(config)
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
    server = ApiServer(config)

    app.state.load_settings = load_settings  # POST /reconcile re-reads the config
    sighup_levers = on_sighup(sup)  # the desired levers; levers_source = "config" reconciles

    if load_settings is None:

        def reload() -> None:
            log.warning("reload (SIGHUP): no config to re-read; nothing changed")

        reloader = None
    else:
        reloader = Reloader(
            load_settings,
            settings,
            app.state.access,
            log_level_pinned=log_level is not None,
            on_new=sighup_levers,
            # uvicorn's serving context, set once it loaded the certificate.
            tls_context=lambda: getattr(config, "ssl", None),
            warn=sup.warn,
            resolve=sup.warning_resolved,
        )
        reload = reloader.request

    stopping = Stopping(sup, app, server, reload)
    signals.attach(asyncio.get_running_loop(), stopping.on_signal)
    journal = server_log_forwarder(settings, sup)  # [server] log_to_journal
    slurm = settings.server.launcher == "slurm"  # the allocation unusable: exit 4
    watch = (
        asyncio.create_task(watch_allocation(sup, stopping.allocation_unusable)) if slurm else None
    )
    try:
        # The API answers from the first instant (/healthz, /status saying what is still
        # loading, 503 + Retry-After for mutating calls) while start-up reads the state,
        # SGLang's flag schema (seconds: it imports SGLang) and the GPUs beside it.
        starting = asyncio.create_task(_start_beside_api(sup, stopping, server))
        if not stopping.requested.is_set():
            notifier = asyncio.create_task(_notify_when_listening(server, sup))
            try:
                await server.serve(sockets=[sock])
            finally:
                notifier.cancel()
        bad_config = await starting
        if bad_config is not None:  # unknown GPU, invalid initial levers
            print(f"sglang-supervisor: {bad_config}", file=sys.stderr)
            return 2
        close_streams(app)
        budget_us = int(sup.teardown_budget_s() * 1e6)
        sdnotify.notify(
            f"STOPPING=1\nEXTEND_TIMEOUT_USEC={budget_us}\n"
            "STATUS=stopping the server and verifying GPU release"
        )
    finally:
        if reloader is not None:
            await reloader.stop()
        if watch is not None:
            watch.cancel()
        keep = keep_server_on_exit(settings)
        released = await sup.shutdown(keep_server=keep)
        if journal is not None:  # the server's last lines (its drain, its exit) too
            await journal.stop()
        if not keep:
            # What the supervisor had not adopted yet when a stop came during start-up.
            released = await _stop_leftovers(settings, sup) and released
        sock.close()
        flush_suppressed()
        audit_writer.stop()  # what is still queued is written first
        signals.detach()
    if stopping.unusable is not None:  # Slurm refuses the server's steps: a new allocation
        return EXIT_ALLOCATION_UNUSABLE
    # 1: the server was stopped but its GPUs could not be verified released (see the log).
    return 0 if released else 1
