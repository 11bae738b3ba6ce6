"""Settings: the file, then SGLANG_SUPERVISOR_<SECTION>__<KEY> from the environment, then
command-line options; the default config path."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_supervisor import config
from sglang_supervisor.config import load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.upper().startswith("SGLANG_SUPERVISOR_"):
            monkeypatch.delenv(key)


def test_environment_overrides_the_file_and_options_override_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[api]\nport = 9000\nhost = "127.0.0.1"\n[timeouts]\nprobation_s = 5\n')
    monkeypatch.setenv("SGLANG_SUPERVISOR_API__PORT", "9100")
    monkeypatch.setenv("SGLANG_SUPERVISOR_SERVER__GPUS", '["2", "3"]')
    monkeypatch.setenv("SGLANG_SUPERVISOR_INSTANCE", "other.abc123")  # a launch tag
    s = load_settings(path, {"api.host": "127.0.0.9"})
    assert s.api.port == 9100 and s.api.host == "127.0.0.9"
    assert s.server.gpus == ["2", "3"]
    assert s.timeouts.probation_s == 5  # from the file, untouched by the environment
    assert s.instance is None  # never taken from the launch tag
    assert load_settings(path, {"api.port": 9200}).api.port == 9200


def test_a_bad_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_SUPERVISOR_API__PORT", "eighty")
    with pytest.raises(ValueError, match="SGLANG_SUPERVISOR_API__PORT"):
        load_settings(None, {})


def test_default_config_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "SYSTEM_CONFIG", tmp_path / "absent.toml")
    assert config.default_config_path() is None
    system = tmp_path / "config.toml"
    system.write_text("[api]\nport = 9300\n")
    monkeypatch.setattr(config, "SYSTEM_CONFIG", system)
    assert load_settings(None, {}).api.port == 9300
    own = tmp_path / "own.toml"
    own.write_text("[api]\nport = 9400\n")
    monkeypatch.setenv("SGLANG_SUPERVISOR_CONFIG", str(own))
    assert load_settings(None, {}).api.port == 9400


def test_the_retired_sim_oom_fraction_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("simulate = true\n[sim]\ngpus = 2\noom_fraction = 0.95\n")
    settings = load_settings(path, {})
    assert settings.sim.gpus == 2 and not hasattr(settings.sim, "oom_fraction")


def test_router_and_log_level_come_from_the_environment_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container configured by environment alone gets its router and log level (they
    were silently ignored before)."""
    monkeypatch.setenv("SGLANG_SUPERVISOR_ROUTER__URL", "http://127.0.0.1:30100")
    monkeypatch.setenv("SGLANG_SUPERVISOR_LOG_LEVEL", "debug")
    s = load_settings(None, {})
    assert s.router.url == "http://127.0.0.1:30100"
    assert s.log_level == "debug"


def test_a_refused_config_names_the_key_and_file_never_the_value(tmp_path: Path) -> None:
    """A secret under a misspelt section (``[server.lever]``) was quoted in the error
    (pydantic's ``input_value='sk-...'``), which POST /reconcile answers, the audit log
    records and a SIGHUP logs."""
    path = tmp_path / "config.toml"
    path.write_text('[server.lever]\napi_key = "sk-do-not-show"\n[sim]\nhf_token = "hf_hidden"\n')
    with pytest.raises(ValueError) as caught:
        load_settings(path, {})
    text = str(caught.value)
    assert "sk-do-not-show" not in text and "hf_hidden" not in text, text
    assert str(path) in text and "server.lever" in text and "sim.hf_token" in text, text
