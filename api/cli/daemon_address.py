"""Where the CLI finds the daemon: its URL, its token and the certificate to trust, and
where each came from (``-v`` prints it; an unreachable daemon's message names it).

Precedence, for each of them: the command line (``--url``, ``--token`` /
``--token-file``, ``--cacert``), then the CLI's own environment (``$SGLANG_SUPERVISOR_URL``,
``$SGLANG_SUPERVISOR_TOKEN``, ``$SGLANG_SUPERVISOR_CACERT``), then **the daemon's own
settings**, read by the daemon's loader (``sglang_supervisor.config.load_settings``: the
file from ``--config``, else ``$SGLANG_SUPERVISOR_CONFIG``, else
``/etc/sglang-supervisor/config.toml`` when it exists; then the
``SGLANG_SUPERVISOR_API__*`` overrides), so the rule has one owner. From those settings:
``[api] host`` (``0.0.0.0``/``::`` mean this host's loopback) and ``port``; ``https`` when
``[api] ssl_certfile`` is set (that certificate is then trusted too); the token in
``[api] token_file``. The daemon's token is sent only to the address that came from the
same settings, never to a ``--url`` given by hand.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_supervisor_api.cli.client import URL_ENV, normalize_url
from sglang_supervisor_api.cli.client_errors import ClientError
from sglang_supervisor_api.cli.tls import CACERT_ENV
from sglang_supervisor_api.env_names import TOKEN_ENV

if TYPE_CHECKING:
    from sglang_supervisor.config import ApiSettings


@dataclass(frozen=True)
class DaemonSettings:
    """The daemon's ``[api]`` settings as the daemon itself would read them, and whence."""

    api: ApiSettings
    #: ``config /etc/sglang-supervisor/config.toml, $SGLANG_SUPERVISOR_API__PORT``;
    #: None when neither a file nor the environment set anything (the defaults).
    origin: str | None
    config: Path | None


@dataclass(frozen=True)
class DaemonAddress:
    """The daemon to talk to and how: each value with the place it came from."""

    url: str
    url_from: str
    token: str | None = None
    token_from: str | None = None
    cacert: Path | None = None
    cacert_from: str | None = None

    def describe(self) -> str:
        """``daemon http://127.0.0.1:18800 (from $SGLANG_SUPERVISOR_API__PORT); token
        from [api] token_file /etc/...``: what ``-v`` prints."""
        text = f"daemon {self.url} (address from {self.url_from})"
        text += f"; token from {self.token_from}" if self.token else "; no token"
        if self.cacert is not None:
            text += f"; trusting {self.cacert} (from {self.cacert_from})"
        return text


def daemon_settings(config: Path | None) -> DaemonSettings:
    """The daemon's settings through its own loader. Raises ``ClientError`` naming the
    file or variable when they cannot be read (then ``--url`` is the way out).

    The system config (``/etc/sglang-supervisor/config.toml``, found by default) kept from
    this user (the install makes it ``root:sglang 0640`` in a ``0750`` directory) is not
    an error: the environment and the defaults stand, and the origin says why. A file
    named by ``--config`` or ``$SGLANG_SUPERVISOR_CONFIG`` must be readable."""
    from sglang_supervisor.config import (
        CONFIG_ENV,
        ENV_PREFIX,
        SYSTEM_CONFIG,
        default_config_path,
        load_settings,
        settings_from_environment,
    )

    hidden: str | None = None
    try:
        path = config if config is not None else default_config_path()
    except OSError as exc:  # Python 3.11: is_file() raises EACCES inside a 0750 directory
        path, hidden = None, exc.strerror
    by_default = config is None and not os.environ.get(CONFIG_ENV)
    if by_default and path == SYSTEM_CONFIG and not os.access(path, os.R_OK):
        path, hidden = None, "Permission denied"
    try:
        # With the system config out of reach: the environment over the defaults (an
        # empty file stands in for it, so the loader does not look for it again).
        settings = load_settings(Path(os.devnull) if hidden else path, {})
        env_api = settings_from_environment().get("api") or {}
    except ValueError as exc:
        first = str(exc).strip().splitlines()[0]
        raise ClientError(
            f"cannot find the daemon's address in its settings: {first}; pass --url "
            f"(or set ${URL_ENV}) to do without them, or fix what is named"
        ) from exc
    parts = [f"config {path}"] if path is not None else []
    if hidden:
        parts.append(f"{SYSTEM_CONFIG} not readable by this user ({hidden}), so the defaults")
    parts += [f"${ENV_PREFIX}API__{key.upper()}" for key in sorted(env_api)]
    return DaemonSettings(settings.api, ", ".join(parts) or None, path)


def api_url(api: ApiSettings) -> str:
    """The URL that reaches a daemon listening as ``api`` says, from this host: a
    wildcard address (``0.0.0.0``, ``::``) is reached on loopback; TLS means https."""
    host = api.host.strip() or "127.0.0.1"
    if host == "0.0.0.0":
        host = "127.0.0.1"
    elif host in ("::", "[::]"):
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 literal
    scheme = "https" if api.ssl_certfile else "http"
    return f"{scheme}://{host}:{api.port}"


def _read_token_file(path: Path, what: str) -> str | None:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ClientError(
            f"cannot read {what} {path}: {exc.strerror}; run this as a user that may read it "
            f"(the daemon keeps it mode 600), or pass --token / --token-file, or set "
            f"${TOKEN_ENV}"
        ) from exc
    return text.strip() or None


def resolve_address(
    url: str | None,
    token: str | None = None,
    token_file: Path | None = None,
    cacert: Path | None = None,
    config: Path | None = None,
) -> DaemonAddress:
    """The daemon's address, token and trusted certificate from the options (None: not
    given), the environment and the daemon's settings, in that order. Raises
    ``ClientError`` when the settings or a token file cannot be read."""
    daemon: DaemonSettings | None = None
    if url:
        where, url_from = url, "--url"
    elif env_url := os.environ.get(URL_ENV, "").strip():
        where, url_from = env_url, f"${URL_ENV}"
    else:
        daemon = daemon_settings(config)
        if daemon.api.port == 0:
            raise ClientError(
                f"the daemon's [api] port is 0 ({daemon.origin}): it listens on a port "
                "chosen at start; pass --url with the port it logged"
            )
        where = api_url(daemon.api)
        url_from = (
            f"the daemon's settings: {daemon.origin}"
            if daemon.origin
            else "the default (no daemon config: neither --config, "
            "$SGLANG_SUPERVISOR_CONFIG nor /etc/sglang-supervisor/config.toml)"
        )
    address = DaemonAddress(normalize_url(where), url_from)

    token_from: str | None = None
    if token and token.strip():
        token, token_from = token.strip(), "--token"
    elif token_file is not None:
        token, token_from = _read_token_file(token_file, "the token file"), "--token-file"
    elif env_token := os.environ.get(TOKEN_ENV, "").strip():
        token, token_from = env_token, f"${TOKEN_ENV}"
    elif daemon is not None and daemon.api.token_file:
        path = Path(daemon.api.token_file)
        what = f"the daemon's token file ([api] token_file of {daemon.origin})"
        token, token_from = _read_token_file(path, what), f"[api] token_file {path}"
    else:
        token = None

    cacert_from: str | None = None
    if cacert is not None:
        cacert_from = "--cacert"
    elif env_cacert := os.environ.get(CACERT_ENV, "").strip():
        cacert, cacert_from = Path(env_cacert), f"${CACERT_ENV}"
    elif daemon is not None and daemon.api.ssl_certfile:
        # The daemon's own certificate, when this user may read it (a certificate is not
        # a secret); else the system's CAs, and a failed handshake says to pass --cacert.
        cert = Path(daemon.api.ssl_certfile)
        if os.access(cert, os.R_OK):
            cacert, cacert_from = cert, f"[api] ssl_certfile {cert}"
    return DaemonAddress(
        address.url,
        address.url_from,
        token if token else None,
        token_from if token else None,
        cacert,
        cacert_from,
    )
