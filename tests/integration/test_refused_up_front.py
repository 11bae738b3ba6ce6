"""Values that can never start are refused with a 422 before anything is touched, on the
simulated backend with the bundled SGLang 0.5.23 schema (no SGLang installed): the
server's pid stays the same and /status keeps answering."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Daemon
from tests.integration.never_serve import IDS, NEVER_SERVE, make_fifo, with_fifo

CASES: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    ("surrogate_in_a_lever", {"served_model_name": "a\ud800"}, {}, "served_model_name"),
    ("surrogate_in_env", {}, {"NCCL_DEBUG": "\ud800"}, "env.NCCL_DEBUG"),
    ("oversized_value", {"served_model_name": "x" * 200_000}, {}, "served_model_name"),
    ("base_gpu_id_outside", {"tp_size": 2, "base_gpu_id": 3}, {}, "base_gpu_id"),
    ("gpu_id_step_outside", {"tp_size": 4, "gpu_id_step": 2}, {}, "gpu_id_step"),
    (
        "list_item_read_as_a_flag",
        {"uvicorn_access_log_exclude_prefixes": ["-1e-05"]},
        {},
        "uvicorn_access_log_exclude_prefixes",
    ),
    ("model_path_null", {"model_path": None}, {}, "model_path"),
    ("tp_size_negative", {"tp_size": -8}, {}, "tp_size"),
    ("mem_fraction_static_5", {"mem_fraction_static": 5}, {}, "mem_fraction_static"),
    ("injection_env", {}, {"CUDA_INJECTION64_PATH": "/tmp/x.so"}, "env.CUDA_INJECTION64_PATH"),
    ("nccl_plugin_env", {}, {"NCCL_NET_PLUGIN": "evil"}, "env.NCCL_NET_PLUGIN"),
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = Daemon(
        tmp_path_factory.mktemp("upfront"), gpus=4, extra={"api": {"max_request_bytes": 1 << 20}}
    )
    d.start()
    yield d
    assert d.stop() == 0
    d.client.close()


@pytest.mark.parametrize(("name", "levers", "env", "lever"), CASES, ids=[c[0] for c in CASES])
def test_refused_before_anything_is_touched(
    daemon: Daemon, name: str, levers: dict[str, Any], env: dict[str, Any], lever: str
) -> None:
    before = daemon.status()
    # As JSON escapes: a client can send a lone surrogate ("\\ud800") in valid JSON.
    body = json.dumps({"levers": levers, "env": env})
    r = daemon.client.post(
        "/levers",
        params={"wait": "true"},
        content=body,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422, (name, r.text[:500])
    problems = r.json()["detail"]["problems"]
    assert lever in [p["lever"] for p in problems], problems
    after = daemon.status()
    assert after["server"]["pid"] == before["server"]["pid"] and after["state"] == "ready"
    assert after["levers"] == before["levers"] and after["env"] == before["env"]
    assert daemon.client.get("/levers").status_code == 200


@pytest.fixture(scope="module")
def fifo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fifo(tmp_path_factory.mktemp("fifo"))


@pytest.mark.parametrize(("name", "levers", "env", "lever", "text"), NEVER_SERVE, ids=IDS)
def test_a_value_that_can_never_serve_is_refused_without_sglang(
    daemon: Daemon, fifo: Path, name: str, levers: dict[str, Any], env: dict[str, str], lever: str,
    text: str,
) -> None:  # fmt: skip
    """Issue 27 §5 on the embedded default (no SGLang in server.python): the lever
    limits, and the levers' paths checked by the daemon where the server runs."""
    before = daemon.status()
    r = daemon.apply(with_fifo(levers, fifo), env, dry_run=True)
    assert r.status_code == 422, (name, r.text[:500])
    named = [p for p in r.json()["detail"]["problems"] if p["lever"] == lever]
    assert named and text in named[0]["message"], r.json()["detail"]["problems"]
    after = daemon.status()
    assert after["server"]["pid"] == before["server"]["pid"] and after["state"] == "ready"
