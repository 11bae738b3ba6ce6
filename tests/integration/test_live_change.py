"""Changes without a restart, through the real daemon and the simulated server (which
answers SGLang 0.5.23's runtime endpoints with its own checks): levers SGLang changes
live, and new weights loaded in place — the same pid before and after, no request cut; a
refused live change and a failed weights update leave the old values serving, put back
in place; and when even that fails, the last-good levers restart.

One daemon for the module, its steps in order (each test leaves it ready)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.checkpoints import write_checkpoint
from tests.helpers import Daemon, tagged_processes, wait_until

FAULT = "update_weights_fail=1"  # the first weights update fails mid-load


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("live")
    a = write_checkpoint(work / "ckpt-a", fill=1)
    b = write_checkpoint(work / "ckpt-b", fill=2)  # the same model, other weights
    levers = {
        "model_path": str(a),
        "tp_size": 1,
        "enable_lora": True,
        "admin_api_key": "admin-key-for-the-test",
        "enable_hierarchical_cache": True,
        "hicache_size": 1,
    }
    d = Daemon(work, gpus=1, levers=levers, extra={"server": {"env": {"SGLANG_SIM_FAULTS": FAULT}}})
    d.start()
    try:
        yield {"d": d, "a": str(a), "b": str(b), "work": work}
    finally:
        if d.proc is not None and d.proc.poll() is None:
            assert d.stop() == 0, d.log()
            assert tagged_processes(d.instance) == [], f"left running by {d.instance}"
        d.client.close()


def _server(d: Daemon) -> httpx.Client:
    return httpx.Client(
        base_url=f"http://127.0.0.1:{d.server_port}",
        headers={"Authorization": "Bearer admin-key-for-the-test"},
        trust_env=False,
        timeout=30,
    )


def _pid(d: Daemon) -> int:
    return int(d.status()["server"]["pid"])


def _apply(d: Daemon, levers: dict[str, Any]) -> dict[str, Any]:
    r = d.apply(levers)
    assert r.status_code == 200, r.text
    op: dict[str, Any] = r.json()["operation"]
    return op


def _names(op: dict[str, Any]) -> list[str]:
    return [p["name"] for p in op["phases"]]


def test_live_levers_change_on_the_same_pid_and_no_request_is_cut(ctx: dict[str, Any]) -> None:
    d: Daemon = ctx["d"]
    pid = _pid(d)
    srv = _server(d)
    # A generation in flight across the change: it must finish with every token.
    got: dict[str, Any] = {}

    def generate() -> None:
        body = {"text": "in flight", "sampling_params": {"max_new_tokens": 60}}
        got["r"] = srv.post("/generate", json=body)

    t = threading.Thread(target=generate)
    t.start()
    op = _apply(d, {"log_requests": True, "pp_max_micro_batch_size": 16})
    t.join(30)
    assert op["state"] == "succeeded", op
    assert op["path"] == "live", op
    assert _names(op) == ["validate", "preflight", "live", "verify", "commit"], op
    assert _pid(d) == pid  # no restart
    assert got["r"].status_code == 200 and got["r"].json()["meta_info"]["completion_tokens"] == 60
    st = d.status()
    assert st["levers"]["log_requests"] is True and st["levers"]["pp_max_micro_batch_size"] == 16
    states = srv.get("/server_info").json()["internal_states"]
    assert [s["pp_max_micro_batch_size"] for s in states] == [16]
    verify = next(p for p in op["phases"] if p["name"] == "verify")["detail"]
    assert (
        "/server_info reads" in verify and "the server's log confirms log_requests=True" in verify
    )
    # The request logging is on: the server logs the next request.
    srv.post("/generate", json={"text": "logged now", "sampling_params": {"max_new_tokens": 1}})
    wait_until(lambda: "logged now" in _log(d), 10, 0.05, "the request in the server's log")


def _log(d: Daemon) -> str:
    return str(d.client.get("/logs", params={"tail": 400}).text)


def test_a_refused_live_change_puts_the_old_values_back_live(ctx: dict[str, Any]) -> None:
    """Logging changes first, then SGLang refuses the LoRA adapter: request logging is put
    back on, live, on the same pid; /status still shows the old levers. The adapter passes
    every check before the change (a directory with an adapter_config.json); only SGLang's
    load reads that it is DoRA, which SGLang 0.5.23 refuses (srt/lora/lora_manager.py:349)."""
    d: Daemon = ctx["d"]
    pid = _pid(d)
    dora = Path(ctx["work"]) / "dora-adapter"
    dora.mkdir(exist_ok=True)
    (dora / "adapter_config.json").write_text('{"r": 8, "use_dora": true}')
    op = _apply(d, {"log_requests": False, "lora_paths": [f"bad={dora}"]})
    assert op["state"] == "rolled_back", op
    assert "refused to load LoRA adapter 'bad'" in op["error"], op["error"]
    assert f"the old values were put back live (pid {pid} serves on)" in op["error"]
    assert _names(op)[-1] == "rollback_live", _names(op)
    assert _pid(d) == pid
    st = d.status()
    assert st["levers"]["log_requests"] is True and "lora_paths" not in st["levers"]
    srv = _server(d)
    srv.post("/generate", json={"text": "still logged", "sampling_params": {"max_new_tokens": 1}})
    wait_until(lambda: "still logged" in _log(d), 10, 0.05, "request logging back on")


def test_sglangs_refusal_is_quoted_and_changes_nothing(ctx: dict[str, Any]) -> None:
    """/set_internal_state answers only [false]: the reason comes from SGLang's log."""
    d: Daemon = ctx["d"]
    pid = _pid(d)
    op = _apply(d, {"pp_max_micro_batch_size": 100000})
    assert op["state"] == "rolled_back", op
    said = "Updating pp_max_micro_batch_size to 100000 is rejected because it is out of the"
    assert said in op["error"] and "valid range [1, " in op["error"], op["error"]
    assert f"nothing was changed (pid {pid} serves on)" in op["error"]
    assert _pid(d) == pid and d.status()["levers"]["pp_max_micro_batch_size"] == 16


def test_a_storage_backend_attaches_live(ctx: dict[str, Any]) -> None:
    d: Daemon = ctx["d"]
    pid = _pid(d)
    op = _apply(d, {"hicache_storage_backend": "file"})
    assert op["state"] == "succeeded" and op["path"] == "live", op
    assert _pid(d) == pid
    assert _server(d).get("/hicache/storage-backend").json()["hicache_storage_backend"] == "file"


def test_a_failed_weights_update_is_updated_back(ctx: dict[str, Any]) -> None:
    """SGLang's own recovery reloads the new path: the daemon loads the old one back and
    confirms it in /model_info; nothing is reported that was not confirmed."""
    d: Daemon = ctx["d"]
    pid = _pid(d)
    op = _apply(d, {"model_path": ctx["b"]})
    assert op["path"] == "weights", op
    assert op["state"] == "rolled_back", op
    assert "simulated fault update_weights_fail" in op["error"], op["error"]
    assert f"the old weights ({ctx['a']}, weight_version default) were loaded back" in op["error"]
    assert _names(op)[-1] == "rollback_weights", _names(op)
    srv = _server(d)
    info = srv.get("/model_info").json()
    assert (info["model_path"], info["weight_version"]) == (ctx["a"], "default")
    assert _pid(d) == pid and d.status()["levers"]["model_path"] == ctx["a"]
    # What clients get is the old weights' answer again, not the half-loaded new ones.
    body = {"text": "who", "sampling_params": {"max_new_tokens": 2}}
    assert srv.post("/generate", json=body).json()["text"] == "ckpt-a ckpt-a"


def test_new_weights_load_into_the_same_pid(ctx: dict[str, Any]) -> None:
    d: Daemon = ctx["d"]
    pid = _pid(d)
    op = _apply(d, {"model_path": ctx["b"]})
    assert op["state"] == "succeeded" and op["path"] == "weights", op
    assert "weights" in _names(op) and "stop" not in _names(op), _names(op)
    assert _pid(d) == pid
    info = _server(d).get("/model_info").json()
    assert info["model_path"] == ctx["b"] and info["weight_version"].startswith("ckpt-b@")
    body = {"text": "who", "sampling_params": {"max_new_tokens": 1}}
    assert _server(d).post("/generate", json=body).json()["text"] == "ckpt-b"
    assert d.status()["levers"]["model_path"] == ctx["b"]
    # A rollback of a committed update is another update.
    back = _apply(d, {"model_path": ctx["a"]})
    assert back["state"] == "succeeded" and back["path"] == "weights", back
    assert _pid(d) == pid


def test_a_different_model_restarts_and_says_why(ctx: dict[str, Any]) -> None:
    d: Daemon = ctx["d"]
    other = write_checkpoint(
        Path(ctx["work"]) / "ckpt-wide", config={**_tiny(), "intermediate_size": 1024}
    )
    r = d.apply({"model_path": str(other)}, dry_run=True)
    op = r.json()["operation"]
    assert op["path"] == "restart", op
    assert (
        "config.json differs in intermediate_size (intermediate_size: 512 -> 1024)"
        in (op["path_reason"])
    )


def _tiny() -> dict[str, Any]:
    from tests.checkpoints import TINY_LLAMA

    return dict(TINY_LLAMA)


def test_when_the_old_weights_cannot_be_loaded_back_the_last_good_levers_restart(
    ctx: dict[str, Any],
) -> None:
    """Both the update and the update back fail: the weights in memory are unknown, so
    the server is restarted on the last-good levers (a new pid), never reported as either."""
    d: Daemon = ctx["d"]
    env = {"SGLANG_SIM_FAULTS": "update_weights_fail=2"}
    first = d.apply({}, env=env).json()["operation"]
    assert first["state"] == "succeeded" and first["path"] == "restart", first
    # Before the stop, while the old server served: its weight files into the page cache.
    names = _names(first)
    assert names.index("warmup") < names.index("stop"), names
    warm = next(p for p in first["phases"] if p["name"] == "warmup")["detail"]
    assert "of 2 weight files read into the page cache" in warm, warm
    pid = _pid(d)
    op = _apply(d, {"model_path": ctx["b"]})
    assert op["state"] == "rolled_back", op
    assert "loading the old weights back failed" in op["error"], op["error"]
    assert "rollback_start" in _names(op), _names(op)
    assert _pid(d) != pid
    assert _server(d).get("/model_info").json()["model_path"] == ctx["a"]
    assert d.status()["levers"]["model_path"] == ctx["a"]


def test_a_checkpoint_no_load_could_read_is_refused(ctx: dict[str, Any]) -> None:
    """A shard the index lists is missing: an update would fail, and a restart too; 422,
    the shard named, nothing touched."""
    d: Daemon = ctx["d"]
    broken = write_checkpoint(Path(ctx["work"]) / "ckpt-broken", fill=3)
    (broken / "model-00002-of-00002.safetensors").unlink()
    r = d.apply({"model_path": str(broken)})
    assert r.status_code == 422, r.text
    assert "model-00002-of-00002.safetensors is missing" in r.text, r.text
    assert "nothing was touched" in r.text
