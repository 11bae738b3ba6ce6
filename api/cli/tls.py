"""The CLI's side of the API's TLS (``[api] ssl_certfile``): which certificate authority it
trusts (``--cacert`` / ``$SGLANG_SUPERVISOR_CACERT``, else the system's), and one line for
each way a TLS connection fails, saying what to do.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from sglang_supervisor_api.cli.client_errors import ClientError

CACERT_ENV = "SGLANG_SUPERVISOR_CACERT"


def resolve_cacert(cacert: Path | None) -> Path | None:
    """``--cacert``, else ``$SGLANG_SUPERVISOR_CACERT``, else None (the system's CAs)."""
    if cacert is not None:
        return cacert
    env = os.environ.get(CACERT_ENV, "").strip()
    return Path(env) if env else None


def trust(cacert: Path | None) -> ssl.SSLContext:
    """The client's TLS context: verifies the daemon's certificate and name against
    ``cacert`` (a PEM certificate or CA bundle), else the system's CAs. Raises
    ``ClientError`` when ``cacert`` cannot be read."""
    if cacert is None:
        return ssl.create_default_context()
    try:
        context = ssl.create_default_context(cafile=str(cacert))
    except (OSError, ssl.SSLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ClientError(
            f"cannot load the CA certificate {cacert} (--cacert or ${CACERT_ENV}): {reason}; "
            "give the PEM file of the daemon's certificate or of the CA that signed it"
        ) from exc
    # The certificate named is trusted as it is, also when it is a CA-signed leaf (the
    # daemon's own [api] ssl_certfile), not only as the root of a chain.
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def tls_failure(exc: BaseException, url: str) -> str | None:
    """One line for a failed TLS handshake with the daemon at ``url`` (``exc`` or what
    caused it); None when ``exc`` is not about TLS."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            why = seen.verify_message or seen.reason or str(seen)
            return (
                f"the daemon at {url} presented a certificate this client does not trust "
                f"({why}); pass --cacert PATH (or set ${CACERT_ENV}) naming the daemon's "
                "certificate or the CA that signed it"
            )
        if isinstance(seen, ssl.SSLError):
            return (
                f"the TLS handshake with {url} failed ({seen.reason or seen}); does the daemon "
                "serve https ([api] ssl_certfile)? If not, use an http:// URL"
            )
        seen = seen.__cause__ or seen.__context__
    return None
