"""TLS for the control API: ``[api] ssl_certfile`` / ``ssl_keyfile``, served by uvicorn's
own TLS (``uvicorn.Config(ssl_certfile=..., ssl_keyfile=...)``). A SIGHUP re-reads the
same two files into the serving context (:func:`reload_certificate`); other paths take a
daemon restart.

:func:`check_tls` loads the pair the way uvicorn will, before the daemon locks its state
dir or binds its port, so a missing file, a key that does not match the certificate or a
key readable by others is one line and exit 2, not a traceback from inside uvicorn.
"""

from __future__ import annotations

import logging
import ssl
import stat
from pathlib import Path

from sglang_supervisor.config import ApiSettings
from sglang_supervisor_api.auth import AuthConfigError

log = logging.getLogger("supervisor")


def check_tls(api: ApiSettings) -> None:
    """Load ``[api] ssl_certfile`` and ``ssl_keyfile`` as uvicorn will; raise
    ``AuthConfigError`` naming the file and what to do when they do not load, or when the
    private key is readable by others (mode ``o+r``: it would let anyone on the host
    impersonate the daemon; a group such as ``ssl-cert`` may read it)."""
    if api.ssl_certfile is None or api.ssl_keyfile is None:
        return
    cert, key = Path(api.ssl_certfile), Path(api.ssl_keyfile)
    for what, path in (("ssl_certfile", cert), ("ssl_keyfile", key)):
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            raise AuthConfigError(
                f"cannot read [api] {what} {path}: {exc.strerror}; fix the path, or remove "
                "ssl_certfile and ssl_keyfile to serve plain HTTP"
            ) from exc
        if what == "ssl_keyfile" and mode & stat.S_IRWXO:
            raise AuthConfigError(
                f"[api] ssl_keyfile {path} is readable by others (mode "
                f"{stat.S_IMODE(mode):o}); run: chmod o-rwx {path}"
            )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise AuthConfigError(
            f"[api] ssl_certfile {cert} and ssl_keyfile {key} do not load as a TLS "
            f"certificate and its key ({exc}): both must be PEM, the key unencrypted and "
            "the certificate's own"
        ) from exc


def reload_certificate(context: ssl.SSLContext | None, api: ApiSettings) -> None:
    """SIGHUP: re-read ``[api] ssl_certfile`` / ``ssl_keyfile`` into the serving context,
    so a renewed certificate (certbot, a private CA) is presented on every new connection
    without a restart; connections already open keep the old one. A pair that does not
    load (``check_tls``) changes nothing and is logged."""
    if context is None or api.ssl_certfile is None or api.ssl_keyfile is None:
        return
    try:
        check_tls(api)
        context.load_cert_chain(api.ssl_certfile, api.ssl_keyfile)
    except (AuthConfigError, ssl.SSLError, OSError) as exc:
        log.error("reload (SIGHUP): the TLS certificate stays as it was: %s", exc)
        return
    log.info("reload (SIGHUP): TLS certificate %s re-read", api.ssl_certfile)
