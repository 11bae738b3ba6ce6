"""What a launch compiles is kept on purpose: the daemon gives the server an explicit,
persistent SGLANG_CACHE_DIR (and SGLANG_JIT_CACHE_DIR beside it), a restart finds what the
first launch compiled there, /status shows it with its size, and an operator's own
SGLANG_CACHE_DIR wins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil

from tests.helpers import Daemon, wait_until


def _environ(d: Daemon) -> dict[str, str]:
    pid = int(d.status()["server"]["pid"])
    env: dict[str, str] = psutil.Process(pid).environ()
    return env


def _log(d: Daemon) -> str:
    return str(d.client.get("/logs", params={"tail": 400}).text)


def test_the_cache_directory_survives_a_restart(daemon_factory: Any, tmp_path: Path) -> None:
    d: Daemon = daemon_factory(gpus=2, levers={"model_path": "sim/llama", "tp_size": 2})
    d.start()
    cache = d.dir / "state" / ".cache" / "sglang"
    env = _environ(d)
    assert env["SGLANG_CACHE_DIR"] == str(cache)
    assert env["SGLANG_JIT_CACHE_DIR"] == str(cache / "jit")
    assert "JIT kernels: cache miss, compiled into" in _log(d)
    r = d.client.post("/restart", params={"wait": "true"})
    assert r.json()["operation"]["state"] == "succeeded", r.text
    assert f"JIT kernels: cache hit, reusing {cache}/triton/" in _log(d)

    def measured() -> dict[str, Any] | None:
        got: dict[str, Any] = d.status()["sglang_cache"]
        return got if got["bytes"] else None

    shown = wait_until(measured, 90, 0.2, "/status to show the cache directory's size")
    assert shown["path"] == str(cache) and shown["bytes"] >= 64 * 1024, shown
    # The operator's own directory wins (and JIT caches follow it).
    mine = tmp_path / "my-cache"
    op = d.apply({}, env={"SGLANG_CACHE_DIR": str(mine)}).json()["operation"]
    assert op["state"] == "succeeded", op
    env = _environ(d)
    assert env["SGLANG_CACHE_DIR"] == str(mine)
    assert env["SGLANG_JIT_CACHE_DIR"] == str(mine / "jit")
    assert d.status()["sglang_cache"]["path"] == str(mine)
