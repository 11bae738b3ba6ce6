"""The CLI finds the daemon where the daemon was told to listen: the same config file and
``SGLANG_SUPERVISOR_API__*`` environment, read by the daemon's own loader, with no ``--url``.

Each test runs the CLI as a process against a real ``serve --simulate`` daemon on a
non-default port, and asserts what the operator sees: the status printed, ``-v`` naming
where the address and the token came from, one line when something cannot be read.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sglang_supervisor.config import ApiSettings
from sglang_supervisor_api.cli.client_errors import ClientError
from sglang_supervisor_api.cli.daemon_address import api_url, resolve_address
from tests.helpers import Daemon, free_port, write_toml

REPO = Path(__file__).resolve().parents[2]
#: The CLI's and the daemon's variables a test must not inherit from whoever runs it.
OURS = (
    "SGLANG_SUPERVISOR_URL",
    "SGLANG_SUPERVISOR_TOKEN",
    "SGLANG_SUPERVISOR_CACERT",
    "SGLANG_SUPERVISOR_CONFIG",
)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in OURS and not k.startswith("SGLANG_SUPERVISOR_API__")
    }
    env.update(extra)
    return env


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The CLI as an operator runs it: no --url unless the test gives one."""
    return subprocess.run(
        [sys.executable, "-m", "sglang_supervisor_api.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
        check=False,
    )


def _without_api_port(d: Daemon) -> None:
    """Leave the daemon's port out of its config file: only the environment names it."""
    data = tomllib.loads(d.config_path.read_text())
    del data["api"]["port"]
    write_toml(d.config_path, data)
    d.env["SGLANG_SUPERVISOR_API__PORT"] = str(d.port)


def test_port_from_the_daemons_environment_variable(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory()
    _without_api_port(d)
    d.start()
    env = _clean_env(SGLANG_SUPERVISOR_API__PORT=str(d.port))
    done = cli("status", "-v", env=env)
    assert done.returncode == 0, done.stderr
    assert "ready" in done.stdout
    assert f"daemon http://127.0.0.1:{d.port}" in done.stderr
    assert "$SGLANG_SUPERVISOR_API__PORT" in done.stderr, done.stderr

    # Without the variable the CLI asks the default port, and its message says so.
    if not Path("/etc/sglang-supervisor/config.toml").exists():
        missed = cli("status", env=_clean_env())
        assert missed.returncode == 1
        assert "127.0.0.1:8470" in missed.stderr and "the default" in missed.stderr


def test_address_and_token_from_the_daemons_config_file(
    daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("config-file-token-0123456789\n")
    token_file.chmod(0o400)  # read-only, as an operator may keep it
    d = daemon_factory(extra={"api": {"token_file": str(token_file)}})
    d.client.headers["Authorization"] = "Bearer config-file-token-0123456789"
    d.start()

    # --config, and $SGLANG_SUPERVISOR_CONFIG: the daemon's own ways to name its file.
    for args, env in (
        (["--config", str(d.config_path)], _clean_env()),
        ([], _clean_env(SGLANG_SUPERVISOR_CONFIG=str(d.config_path))),
    ):
        done = cli("levers", "-v", *args, env=env)
        assert done.returncode == 0, done.stderr
        assert "mem_fraction_static" in done.stdout
        assert f"config {d.config_path}" in done.stderr
        assert f"token from [api] token_file {token_file}" in done.stderr

    # The config's token goes only to the config's address: an explicit --url gets none.
    elsewhere = cli("status", "--config", str(d.config_path), "--url", d.url, env=_clean_env())
    assert elsewhere.returncode == 6  # no token sent: the daemon wants one
    assert "wants a token" in elsewhere.stderr, elsewhere.stderr

    # $SGLANG_SUPERVISOR_URL beats the config (a port nobody listens on: refused).
    beaten = cli(
        "status",
        env=_clean_env(
            SGLANG_SUPERVISOR_CONFIG=str(d.config_path),
            SGLANG_SUPERVISOR_URL=f"127.0.0.1:{free_port()}",
        ),
    )
    assert beaten.returncode == 1
    assert "the address is from $SGLANG_SUPERVISOR_URL" in beaten.stderr, beaten.stderr


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_tls_from_the_config_means_https_trusting_its_certificate(
    daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    from tests.integration.test_tls import make_certificate

    cert, key = make_certificate(tmp_path)
    d = daemon_factory(extra={"api": {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}})
    d.client.close()
    import ssl

    import httpx

    trust = ssl.create_default_context(cafile=str(cert))
    d.url = f"https://127.0.0.1:{d.port}"
    d.client = httpx.Client(base_url=d.url, verify=trust, timeout=60, trust_env=False)
    d.start()
    done = cli("status", "-v", "--config", str(d.config_path), env=_clean_env())
    assert done.returncode == 0, done.stderr
    assert f"daemon https://127.0.0.1:{d.port}" in done.stderr
    assert f"trusting {cert}" in done.stderr


# ------------------------------------------------------------- without a daemon


def test_wildcard_listen_addresses_are_reached_on_loopback() -> None:
    assert api_url(ApiSettings(host="0.0.0.0", port=18800)) == "http://127.0.0.1:18800"
    assert api_url(ApiSettings(host="::", port=18800)) == "http://[::1]:18800"
    assert api_url(ApiSettings(host="fd00::5", port=1)) == "http://[fd00::5]:1"
    assert api_url(ApiSettings(host="gpu-a.internal", port=8470)) == "http://gpu-a.internal:8470"
    tls = ApiSettings(host="127.0.0.1", port=8443, ssl_certfile="/c", ssl_keyfile="/k")
    assert api_url(tls) == "https://127.0.0.1:8443"


def test_precedence_flag_then_cli_environment_then_daemon_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in OURS:
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "config.toml"
    config.write_text('[api]\nhost = "0.0.0.0"\nport = 18801\n')
    monkeypatch.setenv("SGLANG_SUPERVISOR_CONFIG", str(config))
    monkeypatch.setenv("SGLANG_SUPERVISOR_API__PORT", "18802")  # the env beats the file
    got = resolve_address(None)
    assert got.url == "http://127.0.0.1:18802"
    assert got.url_from == (f"the daemon's settings: config {config}, $SGLANG_SUPERVISOR_API__PORT")
    monkeypatch.setenv("SGLANG_SUPERVISOR_URL", "127.0.0.1:18803")
    assert resolve_address(None).url == "http://127.0.0.1:18803"
    assert resolve_address("http://h:1").url == "http://h:1"
    assert resolve_address("http://h:1").url_from == "--url"


def test_unreadable_token_file_of_the_config_is_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in OURS:
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "config.toml"
    missing = tmp_path / "no-such-token"
    config.write_text(f'[api]\nport = 18804\ntoken_file = "{missing}"\n')
    with pytest.raises(ClientError) as caught:
        resolve_address(None, config=config)
    message = str(caught.value)
    assert str(missing) in message and "[api] token_file" in message
    assert "--token" in message and str(config) in message
    # A token given by hand makes the file irrelevant.
    assert resolve_address(None, token="t", config=config).token == "t"

    bad = tmp_path / "bad.toml"
    bad.write_text("[api\n")
    with pytest.raises(ClientError) as caught:
        resolve_address(None, config=bad)
    assert str(bad) in str(caught.value) and "--url" in str(caught.value)


def test_rollout_to_an_unreachable_replica_names_its_own_options() -> None:
    """rollout has --daemon and --fleet, no --url: its hint must name those."""
    url = f"http://127.0.0.1:{free_port()}"
    done = cli("rollout", "--daemon", url, "--set", "mem_fraction_static=0.8", env=_clean_env())
    assert done.returncode == 1
    said = done.stdout + done.stderr
    assert f"cannot reach the daemon at {url}" in said
    assert "--url" not in said, said
    assert "--daemon URL" in said and "the address is from --daemon" in said


def test_system_config_kept_from_this_user_leaves_the_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The install keeps /etc/sglang-supervisor 0750 root:sglang: an operator outside the
    group still gets the environment and the default address (and -v says why), not an
    error; Python 3.11's is_file() raises EACCES there, which must not escape either."""
    import sglang_supervisor.config as config_module
    from sglang_supervisor_api.cli import daemon_address

    for name in OURS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("SGLANG_SUPERVISOR_API__PORT", raising=False)
    system = tmp_path / "config.toml"
    system.write_text("[api]\nport = 18899\n")
    monkeypatch.setattr(config_module, "SYSTEM_CONFIG", system)
    assert resolve_address(None).url == "http://127.0.0.1:18899"  # readable: used

    real_access = os.access
    monkeypatch.setattr(
        daemon_address.os,
        "access",
        lambda p, mode: False if Path(p) == system else real_access(p, mode),
    )
    got = resolve_address(None)
    assert got.url == "http://127.0.0.1:8470"
    assert f"{system} not readable by this user (Permission denied)" in got.url_from

    def no_stat() -> Path | None:
        raise PermissionError(13, "Permission denied", str(system))

    monkeypatch.setattr(config_module, "default_config_path", no_stat)
    monkeypatch.setenv("SGLANG_SUPERVISOR_API__PORT", "18898")
    got = resolve_address(None)
    assert got.url == "http://127.0.0.1:18898"
    assert "not readable by this user" in got.url_from
    assert got.url_from.endswith("$SGLANG_SUPERVISOR_API__PORT")
