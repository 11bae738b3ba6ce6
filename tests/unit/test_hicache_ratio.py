"""Preflight sizes an explicit ``hicache_ratio`` host pool as SGLang 0.5.23 does: ratio ×
the rank's real device KV pool (after the weights), in whole pages plus a padding page
(``sglang/srt/mem_cache/pool_host/base.py:215-229``, bytes at ``:249``; the bytes per
token ``pool_host/mla.py:301-302`` / ``pool_host/mha.py:290-296``) — not ratio × 0.9 × the
GPU. Never refuse a set SGLang would start; an unknown model warns, never refuses."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor import planner
from sglang_supervisor.host import preflight
from sglang_supervisor.host.gpu import GpuInfo
from sglang_supervisor.planner.hostpool import DevicePool
from sglang_supervisor.sglang.levers import LeverSet
from tests.inprocess import api_client
from tests.planner_cases import H200, planner_model
from tests.unit.fakes import FakeProbe, make_rig, run

DATA = Path(__file__).resolve().parents[1] / "data" / "models"

GiB = 1 << 30
GB = 10**9


def _check(levers: dict[str, Any], ram_gib: float, pool: DevicePool | None) -> list[str]:
    gpus = [GpuInfo(i, f"GPU-{i}", "NVIDIA H200", H200) for i in range(8)]
    problems = preflight.check(
        LeverSet({"model_path": "m", **levers}),
        managed=gpus,
        samples=None,
        member_pids=set(),
        pids_are_local=False,
        host=preflight.HostFacts(int(ram_gib * GiB), "simulated"),
        freed_on_stop_bytes=0,
        server_host="127.0.0.1",
        server_port=1,
        port_is_ours=True,
        device_pool=pool,
    )
    return [f"{p.lever}: {p.message}" for p in problems]


DSV3 = {"tp_size": 8, "enable_hierarchical_cache": True}


def test_deepseek_v3_ratio_4_is_sized_from_the_device_pool() -> None:
    """DeepSeek-V3 TP8 at SGLang's 0.886: 695,635 device tokens × 70,272 B (MLA
    (512 + 64) × 61 layers × 2 B); ratio 4 → (2,782,540 // 1 + 1) tokens pinned =
    195.5 GB per rank, 1,564 GB for 8 ranks: under the 2,048 GiB host's 2,188 GB budget.
    Today's preflight said 542.7 GB per rank and refused it."""
    levers = {**DSV3, "hicache_ratio": 4}
    pool = DevicePool.of(planner_model("DeepSeek-V3"), levers, H200)
    assert pool.tokens == 695_635 and pool.full_cell_bytes == (512 + 64) * 61 * 2
    assert pool.host_bytes(4) == (695_635 * 4 + 1) * 70_272
    assert round(pool.host_bytes(4) / GB, 1) == 195.5
    assert _check(levers, 2048, pool) == []


def test_a_ratio_sglang_refuses_is_refused_with_its_numbers() -> None:
    """Ratio 12: 586.6 GB per rank × 8 = 4,693 GB > 2,188 GB: SGLang's
    pool_host/base.py:248-257 refuses it at start, so preflight refuses before the stop."""
    levers = {**DSV3, "hicache_ratio": 12}
    pool = DevicePool.of(planner_model("DeepSeek-V3"), levers, H200)
    (msg,) = _check(levers, 2048, pool)
    assert msg.startswith("hicache_ratio: the hierarchical cache needs 586.6 GB per rank")
    assert "12 × the device pool of 695,635 tokens" in msg


def test_an_unknown_model_warns_instead_of_refusing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="supervisor"):
        assert _check({**DSV3, "hicache_ratio": 12}, 2048, None) == []
    assert "hicache_ratio=12" in caplog.text and "not checked before the stop" in caplog.text


def test_hybrid_swa_host_pool_holds_both_pools() -> None:
    """gpt-oss TP8: a full and an SWA host pool, each ratio × its device pool
    (hybrid_cache/hybrid_pool_assembler.py:407,482)."""
    levers = {"tp_size": 8, "enable_hierarchical_cache": True, "hicache_ratio": 2}
    pool = DevicePool.of(planner_model("gpt-oss-120b"), levers, H200)
    full = (pool.tokens * 2 + 1) * 256 * 18
    swa = (pool.swa_tokens * 2 + 1) * 256 * 18
    assert pool.host_bytes(2) == full + swa


def test_the_running_servers_ratio_pool_frees_what_sglang_pinned() -> None:
    levers = {**DSV3, "hicache_ratio": 4}
    pool = DevicePool.of(planner_model("DeepSeek-V3"), levers, H200)
    host = preflight.HostFacts(100 * GiB, "host")
    _, freed = preflight.running_host_pool(levers, H200, host, pool)
    assert freed == 8 * pool.host_bytes(4)
    assert planner.GB == GB


def test_apply_of_a_ratio_sglang_starts_is_not_refused_by_preflight(tmp_path: Path) -> None:
    """Through the API, on the simulated 2,048 GiB host with 8 H200s: DeepSeek-V3 TP8
    hicache_ratio 4 applies (SGLang pins 1,564 GB); ratio 12 is refused before the stop,
    the server's pid unchanged."""

    async def scenario() -> None:
        probe = FakeProbe(8, memory_total_bytes=H200)
        model = str(DATA / "deepseek-v3")
        levers = {"model_path": model, "tp_size": 8}
        async with api_client(tmp_path, probe=probe, levers=levers) as (client, rig, _):
            pid = rig.sup.server.handle.pid if rig.sup.server else None
            bad = {**levers, **DSV3, "hicache_ratio": 12}
            r = await client.post("/levers?wait=true", json={"levers": bad})
            assert r.status_code == 422, r.text
            (problem,) = r.json()["detail"]["problems"]
            assert problem["lever"] == "hicache_ratio"
            assert "× the device pool of" in problem["message"]
            assert (rig.sup.server.handle.pid if rig.sup.server else None) == pid
            good = {**levers, **DSV3, "hicache_ratio": 4}
            r = await client.post("/levers?wait=true", json={"levers": good})
            assert r.status_code == 200, r.text
            assert r.json()["operation"]["state"] == "succeeded", r.text
            assert rig.sup.levers.levers["hicache_ratio"] == 4

    run(scenario, timeout=30)


def test_plan_counts_what_a_running_ratio_cache_frees_as_sglang_sized_it(
    tmp_path: Path,
) -> None:
    """POST /plan's host RAM adds what the running server's host cache frees at the stop:
    an explicit hicache_ratio 4 on DeepSeek-V3 TP8 pinned 8 × 195.5 GB (SGLang's sizing),
    not 8 × 542.7 GB (ratio × 0.9 × the GPU)."""
    from sglang_supervisor_api.plan import PlanRequest, _hardware

    async def scenario() -> None:
        probe = FakeProbe(8, memory_total_bytes=H200)
        levers = {"model_path": "m", **DSV3, "hicache_ratio": 4}
        rig = make_rig(tmp_path, probe=probe, backend_name="sglang", levers=levers)
        await rig.start_ready()
        try:
            model = planner_model("DeepSeek-V3")
            view = rig.sup.view()
            without = _hardware(PlanRequest(), view, None).host_ram_available_bytes
            hw = _hardware(PlanRequest(), view, model)
            pool = DevicePool.of(model, levers, H200)
            freed = hw.host_ram_available_bytes - (
                without - preflight.pinned_host_bytes(levers, H200)
            )
            assert freed == 8 * pool.host_bytes(4)
            assert (
                f"{8 * pool.host_bytes(4) / GiB:.0f} GiB the running server" in hw.host_ram_source
            )
        finally:
            await rig.sup.shutdown()

    run(scenario, timeout=30)
