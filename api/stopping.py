"""What the daemon's signals do once it serves, on the event loop (``Stopping``):
SIGTERM/SIGINT stop it, a second one forces, SIGHUP reloads its settings, and a signal
Slurm delivers twice counts once (``sglang_supervisor_api.slurm_daemon``). The handlers
that record the signals from the daemon's first instant: ``daemon_signals``."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI

from sglang_supervisor.engine import Supervisor
from sglang_supervisor_api.app import close_streams
from sglang_supervisor_api.slurm_daemon import SlurmTwins

log = logging.getLogger("supervisor")


class Stopping:
    """What the daemon's signals do, on the loop: SIGTERM/SIGINT stop it, SIGHUP reloads
    its settings.

    The first SIGTERM/SIGINT is graceful: the API stops, the running operation ends at
    its next phase boundary, the server is stopped (SIGTERM, ``stop_grace_s``, SIGKILL)
    and its GPUs verified released. Whether a later one forces is the supervisor's rule
    (``Supervisor.request_shutdown``: its second request does): then no drain, and the
    supervisor's own teardown SIGKILLs at once, even in the middle of a grace period
    (``cut_grace``); the release is still verified. The daemon only mirrors the outcome
    onto uvicorn (``force_exit``), like uvicorn's own ``handle_exit``; it starts no sweep
    of its own beside the supervisor's teardown.

    SIGUSR1 (the Slurm batch script's) never forces, nor does its SIGTERM twin from Slurm
    (``sglang_supervisor_api.slurm_daemon``).
    """

    def __init__(
        self,
        sup: Supervisor,
        app: FastAPI,
        server: uvicorn.Server,
        reload: Callable[[], Any],
    ) -> None:
        self.sup = sup
        self.app = app
        self.server = server
        self.reload = reload
        #: The first SIGTERM/SIGINT/SIGUSR1 came.
        self.requested = asyncio.Event()
        #: Why the Slurm allocation can no longer host the server (exit 4), once seen.
        self.unusable: str | None = None
        self.twins = SlurmTwins()

    def allocation_unusable(self, why: str) -> None:
        """The daemon's own stop (``slurm_daemon.watch_allocation``): a SIGUSR1's."""
        self.unusable = why
        self.on_signal(signal.SIGUSR1)

    def on_signal(self, sig: signal.Signals) -> None:
        if sig == signal.SIGHUP:
            self.reload()
            return
        if self.twins.absorbed(sig, self.requested.is_set()):
            return  # one signal from Slurm, one stop (sglang_supervisor_api.slurm_daemon)
        self.server.should_exit = True
        close_streams(self.app)
        self.requested.set()
        was_forced = self.sup.shutdown_forced
        self.sup.request_shutdown()  # the supervisor decides whether this one forces
        if not self.sup.shutdown_forced:
            log.info(
                "%s: stopping: the server is stopped and its GPUs verified released "
                "(or kept with keep_server_on_exit); another %s forces the stop",
                sig.name,
                sig.name,
            )
        elif not was_forced:
            self.server.force_exit = True
            log.warning(
                "%s again: forcing the stop: no drain, SIGKILL without a grace period "
                "(unless the server is kept for the next daemon); the GPUs' release is "
                "still verified",
                sig.name,
            )
