"""Issue 19 §3/§4: values that can never start are refused before the stop, through the
real daemon (``serve --simulate``) with SGLang 0.5.23's own parser and resolution behind
validation (``.venv-sglang``): path- and JSON-valued levers checked where the server
runs, port collisions, ``nnodes`` > 1, and a model given as a Hugging Face id — its
config from the server's local hub cache when there, else SGLang's model-independent
checks run anyway and what did not run is listed (``not_run``).

Every refusal is a 422 naming the lever and the value, and the running server keeps its
pid and state."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Daemon
from tests.integration.never_serve import IDS, NEVER_SERVE, make_fifo, with_fifo
from tests.sglang_env import ROOT, SGLANG_PYTHON, needs_sglang

pytestmark = needs_sglang()

DEEPSEEK = "deepseek-ai/DeepSeek-V3"


@pytest.fixture(scope="module")
def server_cwd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server's working directory: relative paths are read from here."""
    cwd = tmp_path_factory.mktemp("server-cwd")
    (cwd / "tokenizer").mkdir()
    (cwd / "tokenizer" / "tokenizer.json").write_text("{}")
    return cwd


@pytest.fixture(scope="module")
def hub_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An HF_HOME whose hub cache holds DeepSeek-V3's config (huggingface_hub's layout:
    hub/models--org--name/refs/main and snapshots/<commit>/config.json)."""
    home = tmp_path_factory.mktemp("hf-home")
    repo = home / "hub" / "models--deepseek-ai--DeepSeek-V3"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "data" / "models" / "deepseek-v3" / "config.json", snap)
    return home


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, server_cwd: Path) -> Iterator[Daemon]:
    d = Daemon(
        tmp_path_factory.mktemp("paths"),
        gpus=4,
        extra={"server": {"python": SGLANG_PYTHON, "cwd": str(server_cwd)}},
        sim={"host_ram_gib": 256},
    )
    d.start()
    yield d
    assert d.stop() == 0
    d.client.close()


def _refused(
    d: Daemon, levers: dict[str, Any], env: dict[str, Any] | None = None
) -> list[dict[str, str]]:
    before = d.status()
    r = d.apply(levers, env)
    assert r.status_code == 422, r.text
    after = d.status()
    assert after["server"]["pid"] == before["server"]["pid"] and after["state"] == "ready", (
        "a refused request touched the server"
    )
    assert after["levers"] == before["levers"]
    problems: list[dict[str, str]] = r.json()["detail"]["problems"]
    return problems


def _dry(d: Daemon, levers: dict[str, Any], env: dict[str, Any] | None = None) -> dict[str, Any]:
    r = d.apply(levers, env, dry_run=True)
    assert r.status_code == 200, r.text
    op: dict[str, Any] = r.json()["operation"]
    assert op["state"] == "succeeded", op
    return op


#: (case, levers, the lever named, text the message must contain)
PATH_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("model_path_without_config", {"model_path": "/etc"}, "model_path", "'/etc'"),
    ("model_path_missing", {"model_path": "/nonexistent/model"}, "model_path", "does not exist"),
    (
        "tokenizer_path_missing",
        {"tokenizer_path": "/nonexistent/tokenizer"},
        "tokenizer_path",
        "'/nonexistent/tokenizer' does not exist",
    ),
    (
        "tokenizer_path_relative_missing",
        {"tokenizer_path": "./no-tokenizer-here"},
        "tokenizer_path",
        "relative to the server's working directory",
    ),
    (
        "chat_template_file_missing",
        {"chat_template": "/nonexistent/template.jinja"},
        "chat_template",
        "'/nonexistent/template.jinja' is neither a template SGLang has built in",
    ),
    (
        "ssl_ca_certs_missing",
        {"ssl_ca_certs": "/nonexistent/ca.pem"},
        "ssl_ca_certs",
        "'/nonexistent/ca.pem' does not exist",
    ),
    (
        "ssl_ca_certs_a_directory",
        {"ssl_ca_certs": "/etc"},
        "ssl_ca_certs",
        "'/etc' is not a file",
    ),
    (
        "draft_model_without_config",
        {"speculative_draft_model_path": "/etc"},
        "speculative_draft_model_path",
        "'/etc' is a directory without a config.json",
    ),
    (
        "lora_path_plain",
        {"lora_paths": ["/nonexistent/adapter"]},
        "lora_paths",
        "'/nonexistent/adapter' does not exist",
    ),
    (
        "lora_path_name_equals_path",
        {"lora_paths": ["mine=/nonexistent/adapter2"]},
        "lora_paths",
        "'/nonexistent/adapter2' does not exist",
    ),
    (
        "lora_path_json",
        {"lora_paths": [json.dumps({"lora_name": "j", "lora_path": "/nonexistent/adapter3"})]},
        "lora_paths",
        "'/nonexistent/adapter3' does not exist",
    ),
    (
        "lora_path_not_an_adapter",
        {"lora_paths": ["/etc"]},
        "lora_paths",
        "'/etc' is a directory without an adapter_config.json",
    ),
    (
        "json_model_override_args_not_json",
        {"json_model_override_args": "{not json"},
        "json_model_override_args",
        "is not valid JSON",
    ),
    (
        "quantization_param_path_missing",
        {"quantization_param_path": "/nonexistent/scales.json"},
        "quantization_param_path",
        "'/nonexistent/scales.json' does not exist",
    ),
]


@pytest.mark.parametrize(
    ("case", "levers", "lever", "text"), PATH_CASES, ids=[c[0] for c in PATH_CASES]
)
def test_a_path_or_json_that_names_nothing_is_refused(
    daemon: Daemon, case: str, levers: dict[str, Any], lever: str, text: str
) -> None:
    problems = _refused(daemon, levers)
    named = [p for p in problems if p["lever"] == lever]
    assert named, problems
    assert text in named[0]["message"], named[0]["message"]


def test_paths_are_read_as_the_server_sees_them(daemon: Daemon, server_cwd: Path) -> None:
    # ./tokenizer exists under the server's working directory, not the daemon's.
    assert not (Path.cwd() / "tokenizer").exists()
    _dry(daemon, {"tokenizer_path": "./tokenizer"})
    # A Hugging Face id is not a path; a built-in template name is not a file.
    _dry(daemon, {"tokenizer_path": "meta-llama/Llama-3.1-8B-Instruct", "chat_template": "chatml"})
    _dry(daemon, {"json_model_override_args": '{"rope_theta": 10000}'})


@pytest.fixture(scope="module")
def fifo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fifo(tmp_path_factory.mktemp("fifo"))


@pytest.mark.parametrize(("case", "levers", "env", "lever", "text"), NEVER_SERVE, ids=IDS)
def test_a_value_that_can_never_serve_is_refused_with_sglang(
    daemon: Daemon, fifo: Path, case: str, levers: dict[str, Any], env: dict[str, str],
    lever: str, text: str,
) -> None:  # fmt: skip
    """Issue 27 §5 with SGLang 0.5.23's whole pipeline behind validation: each of these
    passed it (SGLang checks them only when it binds, loads or serves, after the stop)."""
    problems = _refused(daemon, with_fifo(levers, fifo), env)
    named = [p for p in problems if p["lever"] == lever]
    assert named and text in named[0]["message"], problems


@pytest.mark.parametrize("which", ["server", "api"])
def test_a_port_lever_on_our_own_ports_is_refused(daemon: Daemon, which: str) -> None:
    port = daemon.server_port if which == "server" else daemon.port
    (p,) = _refused(daemon, {"nccl_port": port})
    assert p["lever"] == "nccl_port" and f"uses port {port}" in p["message"], p
    assert ("server.port" if which == "server" else "api.port") in p["message"]


def test_nnodes_above_one_is_refused_on_a_one_host_daemon(daemon: Daemon) -> None:
    (p,) = _refused(daemon, {"nnodes": 2})
    assert p["lever"] == "nnodes", p
    assert 'server.launcher = "slurm"' in p["message"] and "docs/slurm.md" in p["message"]


# ------------------------------------------------------------------ §4: hub ids


def test_hub_id_not_cached_still_runs_the_model_independent_checks(daemon: Daemon) -> None:
    # SGLang 0.5.23 refuses this at arg_groups/validation_hook.py:304 whatever the model;
    # without a config the probe used to stop at validation_hook.py:215 (a TypeError)
    # and skip it.
    (p,) = _refused(daemon, {"model_path": DEEPSEEK, "retraction_policy": "priority"})
    assert p["lever"] == "retraction_policy", p
    assert "validation_hook.py:304" in p["message"]
    assert "requires --enable-priority-scheduling" in p["message"]


def test_hub_id_not_cached_lists_what_did_not_run(daemon: Daemon) -> None:
    op = _dry(daemon, {"model_path": DEEPSEEK})
    validate = op["phases"][0]
    assert "TypeError" not in validate["detail"] and "NoneType" not in validate["detail"]
    checks = {n["check"]: n["reason"] for n in op["not_run"]}
    reason = checks["SGLang's model-dependent resolution and checks"]
    assert DEEPSEEK in reason and "not in the local hub cache" in reason
    assert all(set(n) == {"check", "reason"} and n["reason"] for n in op["not_run"])
    assert op["resolved"] == {}  # values of a stand-in config are never shown


def test_status_shows_what_the_last_apply_did_not_check(daemon: Daemon) -> None:
    # The simulated server's model, sim/llama, is a hub id with no config anywhere.
    r = daemon.apply({"chunked_prefill_size": 4096})
    assert r.status_code == 200 and r.json()["operation"]["state"] == "succeeded", r.text
    try:
        last = daemon.status()["last_operation"]
        assert last["id"] == r.json()["operation"]["id"]
        (item,) = [n for n in last["not_run"] if "model config" in n["reason"]]
        assert "'sim/llama'" in item["reason"], item
    finally:
        daemon.apply({"chunked_prefill_size": None})


def test_hub_id_in_the_servers_hub_cache_is_resolved_from_it(
    daemon: Daemon, hub_home: Path
) -> None:
    env = {"HF_HOME": str(hub_home)}
    op = _dry(daemon, {"model_path": DEEPSEEK}, env)
    assert not [n for n in op["not_run"] if "model config" in n["reason"]], op["not_run"]
    assert op["resolved"].get("attention_backend"), op["resolved"]
    (p,) = _refused(daemon, {"model_path": DEEPSEEK, "retraction_policy": "priority"}, env)
    assert p["lever"] == "retraction_policy" and "validation_hook.py:304" in p["message"]


#: Refusals no model fact decides: the verdict with stand-in configs (hub id not cached)
#: must equal the verdict with the model's real config (cached).
MODEL_INDEPENDENT: list[dict[str, Any]] = [
    {"retraction_policy": "priority"},
    {"served_model_name": "deepseek:v3"},
    {"chunked_prefill_size": 100, "page_size": 64},
    {"enable_priority_scheduling": True, "schedule_policy": "lpm"},
]


@pytest.mark.parametrize(
    "levers", MODEL_INDEPENDENT, ids=[next(iter(c)) for c in MODEL_INDEPENDENT]
)
def test_stand_in_configs_do_not_change_a_model_independent_verdict(
    daemon: Daemon, hub_home: Path, levers: dict[str, Any]
) -> None:
    with_config = _refused(daemon, {"model_path": DEEPSEEK, **levers}, {"HF_HOME": str(hub_home)})
    without = _refused(daemon, {"model_path": DEEPSEEK, **levers})
    assert with_config == without


def test_the_cli_dry_run_lists_what_did_not_run(daemon: Daemon) -> None:
    from tests.integration.test_cli import cli

    r = cli(daemon, "apply", "--dry-run", "--set", f"model_path={DEEPSEEK}", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    line = "not checked here: SGLang's model-dependent resolution and checks: needs the model"
    assert line in r.stdout and DEEPSEEK in r.stdout, r.stdout
    assert "TypeError" not in r.stdout
