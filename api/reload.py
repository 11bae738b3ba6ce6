"""SIGHUP: re-read the config and apply what can change without touching the server.

Reloaded: the bearer token (``$SGLANG_SUPERVISOR_TOKEN`` or ``[api] token_file``) and the
read-only one (``$SGLANG_SUPERVISOR_READ_TOKEN`` or ``[api] read_token_file``),
``[api] metrics_public``, every ``[timeouts]`` value (each is read when next used),
``keep_server_on_exit`` and ``log_level`` (and the daemon re-reads the TLS certificate:
``sglang_supervisor_api.tls.reload_certificate``), and the levers' desired state —
``[server.levers]``, ``[server.env]``, ``server.levers_source`` — through ``on_new``
(``sglang_supervisor_api.reconcile.after_sighup``: /status's drift follows; with
``levers_source = "config"`` the server is reconciled to them). Everything else (the API
address, the state dir, the instance, the server's GPUs and port, the simulator) is logged
as needing a daemon restart; a config that does not load, or an unsafe token, changes
nothing (the error is logged, shown in /status's ``warnings`` until a later reload
loads, and the daemon keeps its settings).

Nothing of it blocks the event loop (:class:`Reloader`): the files — the config, the
token files, the TLS pair — are read in a worker thread (:func:`reread`), as regular
files with a deadline (``sglang_supervisor.files``: a FIFO, a device or a hung mount is
refused, named), and only what was read is applied on the loop (:func:`apply_reload`).
Meanwhile the API answers, the server is watched and a SIGTERM is acted on. One reload
at a time: a SIGHUP during one runs another after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from sglang_supervisor.config import ServerSettings, Settings
from sglang_supervisor.host import sdnotify
from sglang_supervisor.operations import wall_iso
from sglang_supervisor_api.auth import ApiAccess, AuthConfigError, load_tokens
from sglang_supervisor_api.tls import TlsPair, read_tls, reload_certificate

log = logging.getLogger("supervisor")

#: Settings that take effect only when the daemon restarts (a SIGHUP logs them).
RESTART_ONLY = (
    "simulate",
    "state_dir",
    "instance",
    "api.host",
    "api.port",
    "server",
    "sim",
    "router",
)
RESTART_ONLY_API = (
    "max_request_bytes",
    "body_timeout_s",
    "max_connections",
    "allowed_hosts",
    "ssl_certfile",
    "ssl_keyfile",
)


@dataclass(frozen=True)
class Reread:
    """What a reload read off the event loop: the config, its tokens and the TLS pair,
    or, for each, why it did not load."""

    settings: Settings | None = None
    config_error: str | None = None
    tokens: tuple[str | None, str | None] | None = None
    token_error: str | None = None
    tls: TlsPair | None = None
    tls_error: str | None = None

    def refusals(self) -> list[str]:
        """What was refused, one sentence each (empty: everything loaded)."""
        out = []
        if self.config_error is not None:
            out.append(f"the config does not load, nothing changed: {self.config_error}")
        if self.token_error is not None:
            out.append(f"the token stays as it was, and the read-only one too: {self.token_error}")
        if self.tls_error is not None:
            out.append(f"the TLS certificate stays as it was: {self.tls_error}")
        return out


def reread(load: Callable[[], Settings], running: Settings) -> Reread:
    """Read the config (``load``), its token files and the TLS pair of ``running`` (its
    paths take a restart). Blocking, bounded by the files' deadlines: a worker thread."""
    tls: TlsPair | None = None
    tls_error: str | None = None
    try:
        tls = read_tls(running.api)
    except AuthConfigError as exc:
        tls_error = str(exc)
    try:
        new = load()
    except ValueError as exc:
        return Reread(config_error=str(exc), tls=tls, tls_error=tls_error)
    try:
        tokens = load_tokens(new.api, running.api.host)
    except AuthConfigError as exc:
        return Reread(settings=new, token_error=str(exc), tls=tls, tls_error=tls_error)
    return Reread(settings=new, tokens=tokens, tls=tls, tls_error=tls_error)


def apply_reload(
    got: Reread,
    running: Settings,
    access: ApiAccess,
    *,
    log_level_pinned: bool,
    on_new: Callable[[Settings], list[str]] | None = None,
) -> list[str]:
    """Apply the reloadable part of what ``reread`` read to ``running`` (the daemon's and
    the supervisor's settings object) and ``access``, on the loop; returns what changed,
    one entry each. ``on_new`` takes the rest it can (the levers' desired state) from a
    config that loaded."""
    for refusal in got.refusals():
        log.error("reload (SIGHUP): %s", refusal)
    new = got.settings
    if new is None:
        return []
    changed: list[str] = []
    if got.tokens is not None:
        token, read_token = got.tokens
        if token != access.token or read_token != access.read_token:
            if token != access.token:
                changed.append("the API token" if token else "the API token (removed)")
            if read_token != access.read_token:
                changed.append(
                    "the read-only token" if read_token else "the read-only token (removed)"
                )
            access.rotate(token, read_token)  # open streams are closed
        running.api.token_file = new.api.token_file
        running.api.read_token_file = new.api.read_token_file
    if new.api.metrics_public != access.metrics_public:
        access.metrics_public = running.api.metrics_public = new.api.metrics_public
        changed.append(f"api.metrics_public = {new.api.metrics_public}")
    old_t, new_t = running.timeouts.model_dump(), new.timeouts.model_dump()
    moved = [f"{k} {old_t[k]} -> {new_t[k]}" for k in new_t if new_t[k] != old_t[k]]
    if moved:
        running.timeouts = new.timeouts
        changed.append("timeouts (" + ", ".join(moved) + ")")
    if new.keep_server_on_exit != running.keep_server_on_exit:
        running.keep_server_on_exit = new.keep_server_on_exit
        changed.append(f"keep_server_on_exit = {new.keep_server_on_exit}")
    if new.log_level != running.log_level:
        running.log_level = new.log_level
        if log_level_pinned:
            log.warning(
                "reload (SIGHUP): log_level %s in the config is overridden by --log-level",
                new.log_level,
            )
        else:
            apply_log_level(new.log_level)
            changed.append(f"log_level = {new.log_level}")
    if on_new is not None:
        changed += on_new(new)
    stale = [name for name in RESTART_ONLY if _differs(running, new, name)]
    stale += [f"api.{k}" for k in RESTART_ONLY_API if _differs(running.api, new.api, k)]
    if stale:
        log.warning(
            "reload (SIGHUP): %s changed in the config; that takes a daemon restart "
            "(systemctl restart; the server is adopted with keep_server_on_exit)",
            ", ".join(stale),
        )
    log.info("reload (SIGHUP): %s", "; ".join(changed) if changed else "nothing to change")
    return changed


#: ``[server]`` keys a SIGHUP takes (``on_new``): the levers' desired state.
RELOADED_SERVER = {"levers", "env", "levers_source"}


def _differs(a: object, b: object, dotted: str) -> bool:
    for part in dotted.split("."):
        a, b = getattr(a, part), getattr(b, part)
    if isinstance(a, ServerSettings) and isinstance(b, ServerSettings):
        return a.model_dump(exclude=RELOADED_SERVER) != b.model_dump(exclude=RELOADED_SERVER)
    return bool(a != b)


def apply_log_level(level: str) -> None:
    """Set the daemon's log level (the root logger and uvicorn's)."""
    value = getattr(logging, level.upper())
    logging.getLogger().setLevel(value)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).setLevel(value)


class Reloader:
    """SIGHUP's reload, one at a time, its reading off the event loop (the module
    docstring). A refusal is in /status's ``warnings`` (``warn``) until a later reload
    loads (``resolve``)."""

    def __init__(
        self,
        load: Callable[[], Settings],
        running: Settings,
        access: ApiAccess,
        *,
        log_level_pinned: bool,
        on_new: Callable[[Settings], list[str]],
        tls_context: Callable[[], ssl.SSLContext | None],
        warn: Callable[[str], None],
        resolve: Callable[[str], None],
    ) -> None:
        self.load, self.running, self.access = load, running, access
        self.log_level_pinned = log_level_pinned
        self.on_new, self.tls_context = on_new, tls_context
        self.warn, self.resolve = warn, resolve
        self.task: asyncio.Task[None] | None = None
        self._again = False
        #: The /status warning of the last refused reload (None: the last one loaded).
        self._warning: str | None = None

    def request(self) -> None:
        """A SIGHUP (on the loop): reload now, or once the reload in progress has ended."""
        if self.task is not None and not self.task.done():
            self._again = True
            log.info("reload (SIGHUP): one is in progress; another follows it")
            return
        self.task = asyncio.create_task(self._run(), name="reload")

    async def _run(self) -> None:
        try:
            while True:
                self._again = False
                now_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
                sdnotify.notify(f"RELOADING=1\nMONOTONIC_USEC={now_us}")
                got = await asyncio.to_thread(reread, self.load, self.running)
                apply_reload(
                    got,
                    self.running,
                    self.access,
                    log_level_pinned=self.log_level_pinned,
                    on_new=self.on_new,
                )
                # A renewed certificate at the same paths (uvicorn's context, once loaded).
                reload_certificate(self.tls_context(), got.tls, str(self.running.api.ssl_certfile))
                self._show(got.refusals())
                sdnotify.notify("READY=1")
                if not self._again:
                    return
        except Exception:  # a task nobody awaits: say it here, not as "never retrieved"
            log.exception("reload (SIGHUP) failed; the settings may be partly reloaded")
            sdnotify.notify("READY=1")

    def _show(self, refusals: list[str]) -> None:
        if self._warning is not None:
            self.resolve(self._warning)
            self._warning = None
        if refusals:
            self._warning = (
                f"reload (SIGHUP) at {wall_iso()} refused: {'; '.join(refusals)}; the daemon "
                "keeps the settings it had: fix the file named, then SIGHUP again "
                "(systemctl reload)"
            )
            self.warn(self._warning)

    async def stop(self) -> None:
        """The daemon exits: a reload still reading is abandoned (it changed nothing)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
