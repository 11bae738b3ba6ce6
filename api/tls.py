"""TLS for the control API: ``[api] ssl_certfile`` / ``ssl_keyfile``, served by uvicorn's
own TLS (``uvicorn.Config(ssl_certfile=..., ssl_keyfile=...)``). A SIGHUP re-reads the
same two files (off the event loop, as regular files with a deadline: :func:`read_tls`)
into the serving context (:func:`reload_certificate`); other paths take a daemon restart.

:func:`check_tls` loads the pair the way uvicorn will, before the daemon locks its state
dir or binds its port, so a missing file, a FIFO, a key that does not match the
certificate or a key readable by others is one line and exit 2, not a traceback (or a
hang) from inside uvicorn.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from sglang_supervisor.config import ApiSettings
from sglang_supervisor.files import FileRefused, read_regular
from sglang_supervisor_api.auth import AuthConfigError

log = logging.getLogger("supervisor")

#: A certificate chain or a key is a few KiB; a bound keeps a wrong path from filling memory.
MAX_PEM_BYTES = 1 << 20


@dataclass(frozen=True)
class TlsPair:
    """``[api] ssl_certfile`` and ``ssl_keyfile`` as read (PEM bytes), checked to load."""

    cert: bytes
    key: bytes


def read_tls(api: ApiSettings) -> TlsPair | None:
    """Read ``[api] ssl_certfile`` and ``ssl_keyfile`` (regular files, bounded, with a
    deadline: ``sglang_supervisor.files``) and load them as uvicorn will; None without
    TLS. Raise ``AuthConfigError`` naming the file and what to do when they cannot be
    read or do not load, or when the private key is readable by others (mode ``o+r``: it
    would let anyone on the host impersonate the daemon; a group such as ``ssl-cert``
    may read it). Blocking (a worker thread, or before the event loop runs)."""
    if api.ssl_certfile is None or api.ssl_keyfile is None:
        return None
    cert, key = api.ssl_certfile, api.ssl_keyfile
    data: dict[str, bytes] = {}
    for what, path in (("ssl_certfile", cert), ("ssl_keyfile", key)):
        try:
            read = read_regular(path, f"[api] {what}", max_bytes=MAX_PEM_BYTES)
        except OSError as exc:
            raise AuthConfigError(
                f"cannot read [api] {what} {path}: {exc.strerror}; fix the path, or remove "
                "ssl_certfile and ssl_keyfile to serve plain HTTP"
            ) from exc
        except FileRefused as exc:
            raise AuthConfigError(str(exc)) from exc
        if what == "ssl_keyfile" and read.st.st_mode & stat.S_IRWXO:
            raise AuthConfigError(
                f"[api] ssl_keyfile {path} is readable by others (mode "
                f"{stat.S_IMODE(read.st.st_mode):o}); run: chmod o-rwx {path}"
            )
        data[what] = read.data
    pair = TlsPair(data["ssl_certfile"], data["ssl_keyfile"])
    try:
        load_pair(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), pair)
    except (ssl.SSLError, OSError) as exc:
        raise AuthConfigError(
            f"[api] ssl_certfile {cert} and ssl_keyfile {key} do not load as a TLS "
            f"certificate and its key ({exc}): both must be PEM, the key unencrypted and "
            "the certificate's own"
        ) from exc
    return pair


def check_tls(api: ApiSettings) -> None:
    """``read_tls`` before the daemon locks its state dir or binds its port: a missing
    file, a FIFO, a key that does not match the certificate or a key readable by others
    is one line and exit 2, not a traceback (or a hang) from inside uvicorn."""
    read_tls(api)


def load_pair(context: ssl.SSLContext, pair: TlsPair) -> None:
    """Load ``pair`` into ``context`` from memory (files that exist only in this process:
    nothing on disk is opened, so this never blocks). An encrypted key fails here rather
    than OpenSSL asking for its password on a terminal."""
    with _in_memory(pair.cert) as cert, _in_memory(pair.key) as key:
        context.load_cert_chain(cert, key, password=lambda: b"")


@contextlib.contextmanager
def _in_memory(data: bytes) -> Iterator[str]:
    fd = os.memfd_create("sglang-supervisor-tls", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def reload_certificate(context: ssl.SSLContext | None, pair: TlsPair | None, path: str) -> None:
    """SIGHUP: put the pair a reload read (``read_tls``, off the loop) into the serving
    context, so a renewed certificate (certbot, a private CA) is presented on every new
    connection without a restart; connections already open keep the old one. On the
    loop: it opens no file."""
    if context is None or pair is None:
        return
    try:
        load_pair(context, pair)
    except (ssl.SSLError, OSError) as exc:
        log.error("reload (SIGHUP): the TLS certificate stays as it was: %s", exc)
        return
    log.info("reload (SIGHUP): TLS certificate %s re-read", path)
