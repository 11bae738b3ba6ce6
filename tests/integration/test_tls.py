"""TLS on the control API ([api] ssl_certfile / ssl_keyfile, served by uvicorn's own TLS):
a real handshake with a real ``serve --simulate``, with a certificate the test makes
(``openssl req -x509``); the CLI verifies it (``--cacert``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.helpers import Daemon, serve_refusal, wait_until

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def make_certificate(tmp: Path, name: str = "daemon") -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key (mode 600)."""
    cert, key = tmp / f"{name}.crt", tmp / f"{name}.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=sglang-supervisor test",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    key.chmod(0o600)
    return cert, key


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SGLANG_SUPERVISOR_URL", "SGLANG_SUPERVISOR_TOKEN", "SGLANG_SUPERVISOR_CACERT")
    }
    return subprocess.run(
        [sys.executable, "-m", "sglang_supervisor_api.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **(env or {})},
        check=False,
    )


def test_tls_handshake_and_the_cli_verifies_it(
    daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    cert, key = make_certificate(tmp_path)
    d = daemon_factory(extra={"api": {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}})
    https = f"https://127.0.0.1:{d.port}"
    trust = ssl.create_default_context(cafile=str(cert))
    d.client.close()
    d.client = httpx.Client(base_url=https, verify=trust, timeout=60, trust_env=False)
    d.start()

    # A real handshake: the daemon presents the test's certificate, verified by name.
    with socket_to(d.port) as raw, trust.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
        assert tls.getpeercert()["subjectAltName"] == (
            ("IP Address", "127.0.0.1"),
            ("DNS", "localhost"),
        )
    assert d.status()["state"] == "ready"

    # Plain HTTP to the TLS port gets no answer.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{d.port}/healthz", timeout=10, trust_env=False)

    # The CLI: --cacert and $SGLANG_SUPERVISOR_CACERT verify the daemon.
    ok = _cli("status", "--url", https, "--cacert", str(cert))
    assert ok.returncode == 0, ok.stderr
    assert "ready" in ok.stdout
    ok = _cli("status", "--url", https, env={"SGLANG_SUPERVISOR_CACERT": str(cert)})
    assert ok.returncode == 0, ok.stderr
    # Without it: one line naming the certificate problem and what to pass.
    bad = _cli("status", "--url", https)
    assert bad.returncode != 0
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in bad.stderr, bad.stderr
    assert "self-signed certificate" in lines[0] and "--cacert" in lines[0], lines[0]
    # Another certificate is no proof either.
    other, _ = make_certificate(tmp_path, "other")
    bad = _cli("status", "--url", https, "--cacert", str(other))
    assert bad.returncode != 0 and "does not trust" in bad.stderr, bad.stderr
    # http:// to the TLS port: one line pointing at https.
    plain = _cli("status", "--url", f"http://127.0.0.1:{d.port}")
    assert plain.returncode != 0
    assert len(plain.stderr.strip().splitlines()) == 1, plain.stderr
    assert "https://" in plain.stderr, plain.stderr


def socket_to(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def test_tls_config_refusals(tmp_path: Path) -> None:
    cert, key = make_certificate(tmp_path)
    tls = f'[api]\nssl_certfile = "{cert}"\nssl_keyfile = "{key}"\n'
    # TLS does not replace the token: a non-loopback bind without one is still refused.
    code, err = serve_refusal(tmp_path, tls, "--host", "0.0.0.0")
    assert code == 2 and "refusing to listen on 0.0.0.0 without a token" in err, err
    # A private key anyone on the host can read is refused, naming the file.
    key.chmod(0o644)
    code, err = serve_refusal(tmp_path, tls)
    assert code == 2 and f"chmod o-rwx {key}" in err, err
    key.chmod(0o600)
    # A key that is not the certificate's: one line naming both files.
    _, other_key = make_certificate(tmp_path, "other")
    code, err = serve_refusal(
        tmp_path, f'[api]\nssl_certfile = "{cert}"\nssl_keyfile = "{other_key}"\n'
    )
    assert code == 2 and str(cert) in err and str(other_key) in err, err
    assert "Traceback" not in err
    # Half a pair: the config names what is missing.
    code, err = serve_refusal(tmp_path, f'[api]\nssl_certfile = "{cert}"\n')
    assert code == 2 and "ssl_keyfile is not" in err, err


def _presented(port: int) -> bytes:
    """The certificate (DER) the daemon presents on a new connection."""
    loose = ssl.create_default_context()
    loose.check_hostname = False
    loose.verify_mode = ssl.CERT_NONE
    with socket_to(port) as raw, loose.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_sighup_presents_a_renewed_certificate(
    daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    cert, key = make_certificate(tmp_path)
    d = daemon_factory(extra={"api": {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}})
    d.client.close()
    d.client = httpx.Client(
        base_url=f"https://127.0.0.1:{d.port}",
        verify=ssl.create_default_context(cafile=str(cert)),
        timeout=60,
        trust_env=False,
    )
    d.start(wait_ready=False)
    assert d.proc is not None
    first = _presented(d.port)
    assert first == ssl.PEM_cert_to_DER_cert(cert.read_text())
    # Renewed in place, as certbot or a private CA's agent does.
    renewed = tmp_path / "renewed"
    renewed.mkdir()
    new_cert, new_key = make_certificate(renewed)
    new_key.replace(key)
    new_cert.replace(cert)
    d.proc.send_signal(signal.SIGHUP)
    wanted = ssl.PEM_cert_to_DER_cert(cert.read_text())
    wait_until(lambda: _presented(d.port) == wanted, 20, 0.05, "the renewed certificate")
    # A broken renewal (a key that is not the certificate's) changes nothing.
    _, other_key = make_certificate(renewed, "other")
    other_key.replace(key)
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "the TLS certificate stays as it was" in d.log(), 20, 0.05, "the refusal")
    assert _presented(d.port) == wanted
