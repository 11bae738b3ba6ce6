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
nothing (the error is logged and the daemon keeps its settings).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sglang_supervisor.config import ServerSettings, Settings
from sglang_supervisor_api.auth import ApiAccess, AuthConfigError, load_tokens

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
RESTART_ONLY_API = ("max_request_bytes", "allowed_hosts", "ssl_certfile", "ssl_keyfile")


def reload_settings(
    load: Callable[[], Settings],
    running: Settings,
    access: ApiAccess,
    *,
    log_level_pinned: bool,
    on_new: Callable[[Settings], list[str]] | None = None,
) -> list[str]:
    """Apply the reloadable part of ``load()`` to ``running`` (the daemon's and the
    supervisor's settings object) and ``access``; returns what changed, one entry each.
    ``on_new`` takes the rest it can (the levers' desired state) from a config that loaded."""
    try:
        new = load()
    except ValueError as exc:
        log.error("reload (SIGHUP): the config does not load, nothing changed: %s", exc)
        return []
    changed: list[str] = []
    try:
        token, read_token = load_tokens(new.api, running.api.host)
    except AuthConfigError as exc:
        log.error("reload (SIGHUP): the token stays as it was, and the read-only one too: %s", exc)
    else:
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
