"""Warm restarts on a GPU: the whole apply's time without service (from the stop to the new
server ready), cold vs with the daemon's page-cache warm-up, side by side in one run.

The daemon runs in real mode (NVML) with the SGLang-shaped stand-in (``sglang_standin/``),
whose ranks load the model directory's safetensors onto the GPU (``standin_weights``): here
``SGS_WARM_GB`` (24) GB of them, one GPU. Each round applies a ``mem_fraction_static``
change (a restart) twice, alternating: *cold* — the files dropped from the page cache
(``posix_fadvise DONTNEED``) and the warm-up off (``[timeouts] warmup_timeout_s = 0``,
reloaded by SIGHUP) — and *warm* — the files dropped too, the warm-up on: the daemon reads
them while the old server still serves, so the new server's load reads memory. Figures per
apply and the medians side by side are printed and written to ``$OUT/warm_restart.json``
(or ``$SGS_WARM_RESULTS``).

    bash tests/gpu/run_on_device.sh tests/gpu/test_warm_restart.py        # on the H200
    SGS_E2E_FAKE_NVML=1 SGS_WARM_GB=0.3 \\
      SGLANG_SUPERVISOR_TEST_SGLANG_PYTHON=.venv-sglang/bin/python \\
      pytest tests/gpu/test_warm_restart.py -s                            # rehearsal, no GPU

Skips where there is no GPU (or fake NVML) or no SGLang to validate with, like the
end-to-end test.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor.host import pagecache
from sglang_supervisor.host.gpu import GpuQueryError
from tests.checkpoints import TINY_LLAMA, write_shard
from tests.gpu import e2e
from tests.helpers import Daemon, tagged_processes, wait_until, write_toml

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

GB = 10**9
TOTAL_GB = float(os.environ.get("SGS_WARM_GB", "24"))
ROUNDS = int(os.environ.get("SGS_WARM_ROUNDS", "3"))
SHARD_GB = 2.0
TIMEOUTS = {
    "stop_grace_s": 3.0,
    "kill_timeout_s": 20.0,
    "release_timeout_s": 60.0,
    "ready_timeout_s": 300.0,
    "probation_s": 1.0,
    "liveness_interval_s": 5.0,
    "liveness_timeout_s": 30.0,
    "warmup_timeout_s": 600.0,
}


def write_weights(where: Path, total: float) -> list[Path]:
    """A checkpoint of ``total`` bytes of BF16 safetensors in shards of ``SHARD_GB``."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "config.json").write_text(json.dumps(TINY_LLAMA))
    files, left, i = [], int(total), 0
    weight_map: dict[str, str] = {}
    count = max(1, -(-left // int(SHARD_GB * GB)))
    while left > 0:
        n = min(left, int(SHARD_GB * GB)) // 2 * 2
        name = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
        write_shard(where / name, {f"layers.{i}.weight": ("BF16", (n // 2,))}, fill=0x3F + i)
        weight_map[f"layers.{i}.weight"] = name
        files.append(where / name)
        left -= n
        i += 1
    total_size = sum(f.stat().st_size for f in files)
    index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    (where / "model.safetensors.index.json").write_text(json.dumps(index))
    for f in files:
        with open(f, "rb+") as fh:
            os.fsync(fh.fileno())  # dirty pages cannot be dropped
    return files


def phase(op: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((p for p in op["phases"] if p["name"] == name), None)


def without_service_s(op: dict[str, Any]) -> float:
    """From the stop's start to the new server's /health_generate (the start's end)."""
    stop, start = phase(op, "stop"), phase(op, "start")
    assert stop is not None and start is not None, op["phases"]
    return e2e.wall(start["ended_at"]) - e2e.wall(stop["started_at"])


def set_warmup(d: Daemon, seconds: float) -> None:
    """``[timeouts] warmup_timeout_s`` rewritten and reloaded (SIGHUP), the reload seen."""
    config = tomllib.loads(d.config_path.read_text())
    if config["timeouts"].get("warmup_timeout_s") == seconds:
        return
    config["timeouts"]["warmup_timeout_s"] = seconds
    write_toml(d.config_path, config)
    before = d.log_path.read_text(errors="replace").count("reload (SIGHUP)")
    assert d.proc is not None
    d.proc.send_signal(signal.SIGHUP)
    wait_until(
        lambda: d.log_path.read_text(errors="replace").count("reload (SIGHUP)") > before,
        30,
        0.05,
        "the daemon's reload",
    )


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("warm")
    try:
        host = e2e.Host(work)
    except GpuQueryError as exc:
        pytest.skip(f"no NVML: {exc}")
    if not host.gpus:
        pytest.skip("NVML sees no GPU")
    dirs, why = e2e.real_sglang_dirs()
    if why:
        pytest.skip(why)
    server_python = e2e.make_server_python(work / "server-venv", dirs)
    t0 = time.monotonic()
    model = work / "weights"
    files = write_weights(model, TOTAL_GB * GB)
    write_s = time.monotonic() - t0
    gpu = host.gpus[0]
    d = Daemon(
        work,
        levers={"model_path": str(model), "tp_size": 1, "mem_fraction_static": 0.30},
        timeouts=TIMEOUTS,
        extra={"simulate": False, "server": {"python": str(server_python), "gpus": [gpu.uuid]}},
    )
    d.env = dict(host.daemon_env)
    pagecache.drop(files)
    t0 = time.monotonic()
    d.start(wait_ready=False)
    try:
        d.wait_state("ready", 600)
        yield {
            "d": d,
            "files": files,
            "meta": {
                "mode": host.mode,
                "gpu": {"name": gpu.name, "uuid": gpu.uuid, "total": gpu.memory_total_bytes},
                "weights_bytes": sum(f.stat().st_size for f in files),
                "weights_files": len(files),
                "write_s": round(write_s, 2),
                "first_ready_s": round(time.monotonic() - t0, 2),
                "python": sys.version.split()[0],
            },
        }
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop(180)
        for leftover in tagged_processes(d.instance):
            leftover.kill()
        d.client.close()
        print("\nWARM daemon log tail:\n" + d.log()[-3000:])


def test_warm_vs_cold_time_without_service(bench: dict[str, Any]) -> None:
    d: Daemon = bench["d"]
    files: list[Path] = bench["files"]
    runs: list[dict[str, Any]] = []
    fraction = 0.30
    # The resolution helper's first answer imports SGLang (seconds): not part of any run.
    r = d.apply({"mem_fraction_static": 0.31}, dry_run=True)
    assert r.status_code == 200, r.text
    for rnd in range(ROUNDS):
        for mode in ("cold", "warm"):
            set_warmup(d, TIMEOUTS["warmup_timeout_s"] if mode == "warm" else 0.0)
            dropped = pagecache.drop(files)
            fraction = 0.31 if fraction == 0.30 else 0.30
            r = d.apply({"mem_fraction_static": fraction})
            assert r.status_code == 200, r.text
            op = r.json()["operation"]
            assert op["state"] == "succeeded", op
            warm = phase(op, "warmup")
            assert (warm is not None) == (mode == "warm"), op["phases"]
            if warm is not None:
                assert "read into the page cache" in warm["detail"], warm
            server = d.status()["server"]
            info = e2e_server_info(d)
            run = {
                "round": rnd,
                "mode": mode,
                "dropped_bytes": dropped,
                "without_service_s": round(without_service_s(op), 3),
                "apply_s": op["duration_s"],
                "phases": e2e.phases(op),
                "warmup_detail": None if warm is None else warm["detail"],
                "rank_weights_s": [r.get("weights_s") for r in info["standin"]["ranks"]],
                "rank_loader": [r.get("weights_loader") for r in info["standin"]["ranks"]],
                "pid": server["pid"],
            }
            runs.append(run)
            print("\nWARM " + json.dumps(run, sort_keys=True))
    summary = {}
    for mode in ("cold", "warm"):
        mine = [r for r in runs if r["mode"] == mode]
        summary[mode] = {
            "without_service_s_median": statistics.median(r["without_service_s"] for r in mine),
            "without_service_s": [r["without_service_s"] for r in mine],
            "apply_s_median": statistics.median(r["apply_s"] for r in mine),
            "rank_load_s_median": statistics.median(r["rank_weights_s"][0] for r in mine),
        }
    cold, warm = summary["cold"], summary["warm"]
    summary["ratio_warm_over_cold"] = round(
        warm["without_service_s_median"] / cold["without_service_s_median"], 3
    )
    result = {"meta": bench["meta"], "summary": summary, "runs": runs}
    out = os.environ.get("SGS_WARM_RESULTS") or (
        str(Path(os.environ["OUT"]) / "warm_restart.json") if os.environ.get("OUT") else None
    )
    if out:
        Path(out).write_text(json.dumps(result, indent=1, sort_keys=True))
    gb = bench["meta"]["weights_bytes"] / GB
    print(
        f"\nWARM {gb:.1f} GB of safetensors, {ROUNDS} rounds: time without service (stop -> "
        f"ready) cold {cold['without_service_s_median']:.2f} s vs warm "
        f"{warm['without_service_s_median']:.2f} s (ratio {summary['ratio_warm_over_cold']}); "
        f"the rank's load cold {cold['rank_load_s_median']:.2f} s vs warm "
        f"{warm['rank_load_s_median']:.2f} s; whole apply cold {cold['apply_s_median']:.2f} s "
        f"vs warm {warm['apply_s_median']:.2f} s (the warm-up runs while the old server serves)"
    )


def e2e_server_info(d: Daemon) -> dict[str, Any]:
    import httpx

    r = httpx.get(f"http://127.0.0.1:{d.server_port}/server_info", timeout=30, trust_env=False)
    r.raise_for_status()
    data: dict[str, Any] = r.json()
    return data
