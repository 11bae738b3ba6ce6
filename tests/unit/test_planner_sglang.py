"""The planner matches SGLang 0.5.23 for the models operators run on 8×H200.

Expected figures: tests/planner_cases.py (SGLang's own resolution pipeline for the
fractions, SGLang's pool formulas for cells and tokens, each with its file:line).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor import planner
from sglang_supervisor.host import preflight
from sglang_supervisor.host.gpu import GpuInfo
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.sim import capacity
from tests.planner_cases import CASES, H200, MODELS, Case, planner_model
from tests.planner_evidence import kv_bound

GiB = 1 << 30
MiB = 1 << 20


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_cell_fraction_and_tokens_match_sglang(case: Case) -> None:
    model = planner_model(case.model)
    cap = planner.capacity(model, case.levers, H200, 4096)
    assert cap.mem_fraction_static == case.fraction  # SGLang's default, exactly
    assert cap.cell_bytes_exact == pytest.approx(case.cell, rel=1e-9)
    assert cap.cell_bytes == int(case.cell)
    assert cap.kv_tokens_per_rank == case.kv_tokens()
    for key, value in case.extra.items():
        assert getattr(cap, key) == value, key
    if case.max_running is not None:
        assert cap.max_running_requests == case.max_running


def test_hybrid_pools_are_reported_separately() -> None:
    """gpt-oss: the SWA pool is 0.8 × the full one (pool_configurator.py:879-881);
    Qwen3-Next at SGLang's defaults: the overlap schedule resolves
    mamba_radix_cache_strategy=extra_buffer (arg_groups/overrides.py:476-486), so a
    request takes 3 + 2 state slots (kv_cache_configurator.py:3062-3088,
    allocation_sizing.py:11-19) and the slots cap running requests at slots / 5
    (kv_cache_configurator.py:3134-3151): 5604 // 5 = 1120 at TP8, not 1868."""
    gpt = planner.capacity(planner_model("gpt-oss-120b"), {"tp_size": 8}, H200, 4096)
    assert gpt.swa_tokens_per_rank == int(gpt.kv_tokens_per_rank * 0.8)
    assert (gpt.full_cell_bytes, gpt.swa_cell_bytes) == (256 * 18, 256 * 18)
    qwen = planner.capacity(planner_model("Qwen3-Next-80B-A3B"), {"tp_size": 8}, H200, 4096)
    assert qwen.mamba_state_bytes == 9_658_368
    assert qwen.mamba_slots_per_rank == 5604
    assert qwen.mamba_request_cap == 5604 // 5 == 1120
    assert qwen.max_running_requests == qwen.mamba_request_cap
    assert qwen.concurrent_requests <= qwen.mamba_request_cap


@pytest.mark.parametrize(
    ("levers", "per_request"),
    [
        ({"disable_overlap_schedule": True}, 3),  # auto -> no_buffer (overrides.py:484-486)
        ({"disable_overlap_schedule": True, "page_size": 64}, 4),  # extra_buffer, 1 slot
        ({"mamba_radix_cache_strategy": "extra_buffer_lazy"}, 4),  # allocation_sizing:17
        ({"mamba_radix_cache_strategy": "no_buffer"}, 3),
        ({"disable_radix_cache": True, "max_running_requests": 64}, 1),  # :3063-3064
    ],
)
def test_mamba_slots_per_request_follow_the_resolved_strategy(
    levers: dict[str, Any], per_request: int
) -> None:
    """kv_cache_configurator.py:3062-3088: 3 slots, + the extra buffer's tracking slots."""
    qwen = planner.capacity(
        planner_model("Qwen3-Next-80B-A3B"), {"tp_size": 8, **levers}, H200, 4096
    )
    assert qwen.mamba_request_cap == qwen.mamba_slots_per_rank // per_request


def test_qwen3_next_tp4_at_095_caps_running_requests_at_slots_over_5() -> None:
    """The issue's TP4 case: mem_fraction_static 0.95 → 502 running requests (slots / 5
    by kv_cache_configurator.py:3062-3088 at SGLang's default strategy), not 837."""
    qwen = planner.capacity(
        planner_model("Qwen3-Next-80B-A3B"),
        {"tp_size": 4, "mem_fraction_static": 0.95},
        H200,
        4096,
    )
    assert qwen.max_running_requests == qwen.mamba_slots_per_rank // 5 == 502


def test_the_mtp_layer_counts_only_with_speculative_decoding() -> None:
    model = planner_model("DeepSeek-V3")
    plain = planner.loaded_weight_bytes_per_rank(model, {"tp_size": 8})
    spec = planner.loaded_weight_bytes_per_rank(
        model, {"tp_size": 8, "speculative_algorithm": "EAGLE"}
    )
    assert spec - plain == model.mtp_weight_bytes // 8


def _dsv3_plan(levers: dict[str, Any], ram_gib: int = 2000) -> planner.Plan:
    hw = planner.Hardware(gpus=8, gpu_memory_bytes=H200, host_ram_available_bytes=ram_gib * GiB)
    return planner.propose(planner_model("DeepSeek-V3"), hw, levers, avg_tokens=4096)


def _sglang_rule_attn_dp8(levers: dict[str, Any]) -> float:
    """SGLang's default fraction for DeepSeek-V3 TP8 attention DP 8 with these levers,
    by memory_hook.py:309-315,368-378,389."""
    bs = levers["cuda_graph_max_bs_decode"]
    chunk = levers.get("chunked_prefill_size", 8192)
    reserved = 512 + max(chunk, 2048) * 1.5 + 1024 + bs * 2 + bs * 8 * 3 + 1536
    if bs > 300:
        reserved += bs * 8 * 1.5
    reserved = max(reserved, 10 * 1024)
    return (143771 - reserved) / 143771


def test_attention_dp_is_proposed_for_mla_within_sglangs_rule() -> None:
    plan = _dsv3_plan({"tp_size": 8})
    proposed = plan.proposed_levers
    assert proposed["attn_dp_size"] == 8
    assert proposed["mem_fraction_static"] <= _sglang_rule_attn_dp8(proposed)
    assert plan.proposed.kv_pools == 8
    assert plan.proposed.concurrent_requests > 4 * plan.current.concurrent_requests
    assert any(n.startswith("Attention DP 8:") and "replicated" in n for n in plan.notes)


def test_deprecated_attention_dp_spelling_is_planned_not_refused() -> None:
    plan = _dsv3_plan({"tp_size": 8, "dp_size": 8, "enable_dp_attention": True})
    assert plan.current.ranks == 8 and plan.current.attn_dp_size == 8
    assert "attn_dp_size" not in plan.levers


@pytest.mark.parametrize("refusing", ["disable_radix_cache", "enable_lmcache"])
def test_never_proposes_the_hierarchical_cache_sglang_refuses(refusing: str) -> None:
    hw = planner.Hardware(gpus=8, gpu_memory_bytes=H200, host_ram_available_bytes=2000 * GiB)
    model, levers = planner_model("DeepSeek-V3"), {"tp_size": 8, refusing: True}
    # The evidence would support one (shared prefixes lost to eviction): SGLang refuses it.
    assert (
        "enable_hierarchical_cache"
        in planner.propose(model, hw, {"tp_size": 8}, avg_tokens=4096, live=kv_bound()).levers
    )
    plan = planner.propose(model, hw, levers, avg_tokens=4096, live=kv_bound())
    assert "enable_hierarchical_cache" not in plan.levers
    assert not plan.proposed.hierarchical_cache


def test_validator_refusal_keeps_a_candidate_out() -> None:
    def refuse_attn_dp(levers: Any) -> str | None:
        return "attention DP refused here" if levers.get("attn_dp_size") else None

    hw = planner.Hardware(gpus=8, gpu_memory_bytes=H200, host_ram_available_bytes=2000 * GiB)
    plan = planner.propose(
        planner_model("DeepSeek-V3"),
        hw,
        {"tp_size": 8},
        avg_tokens=4096,
        validate=refuse_attn_dp,
    )
    assert "attn_dp_size" not in plan.levers
    assert any("attention DP refused here" in n for n in plan.notes)


def test_sglangs_own_resolution_replaces_the_planners_rule_when_given() -> None:
    hw = planner.Hardware(gpus=8, gpu_memory_bytes=H200, host_ram_available_bytes=2000 * GiB)
    plan = planner.propose(
        planner_model("DeepSeek-V3"),
        hw,
        {"tp_size": 8},
        avg_tokens=4096,
        resolve=lambda levers: {"mem_fraction_static": 0.880},
    )
    assert plan.current.mem_fraction_static == 0.880
    assert plan.current.mem_fraction_source == "SGLang's own resolution"
    assert any("picks mem_fraction_static 0.880" in n and "says 0.886" in n for n in plan.notes)


def test_fp8_kv_checkpoint_gets_no_fp8_lever() -> None:
    hw = planner.Hardware(gpus=1, gpu_memory_bytes=H200, host_ram_available_bytes=64 * GiB)
    plan = planner.propose(planner_model("Llama-3.1-8B-FP8"), hw, {}, avg_tokens=4096)
    assert "kv_cache_dtype" not in plan.levers
    assert plan.current.kv_cache_dtype == "fp8_e4m3"
    assert any("already stores fp8" in n for n in plan.notes)


def test_fraction_above_sglangs_rule_is_flagged_with_the_number() -> None:
    """The seed's 0.93 with chunk 8192 on Llama-3.1-70B TP8: SGLang's rule is 0.893
    (512 + 12288 + 1024 + 1024 + 464 = 15312 MiB reserved), 0.037 below."""
    config = dict(MODELS["Llama-3.1-8B-FP8"])
    config.update(num_hidden_layers=80, hidden_size=8192, num_attention_heads=64)
    config.pop("quantization_config")
    model = planner.model_from_config(config, name="70b", source="t", weight_bytes=141 * 10**9)
    hw = planner.Hardware(gpus=8, gpu_memory_bytes=H200, host_ram_available_bytes=64 * GiB)
    levers = {"tp_size": 8, "mem_fraction_static": 0.93, "chunked_prefill_size": 8192}
    plan = planner.propose(model, hw, levers, avg_tokens=4096)
    (note,) = [n for n in plan.notes if n.startswith("mem_fraction_static 0.93")]
    assert "0.037 above SGLang's own rule for these levers (0.893)" in note
    assert "≈5.2 GiB" in note


def _preflight(levers: dict[str, Any], ram_gib: float) -> list[str]:
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
    )
    return [f"{p.lever}: {p.message}" for p in problems]


def test_auto_sized_host_cache_passes_preflight_where_sglang_starts_it() -> None:
    """Neither hicache_size nor hicache_ratio: SGLang sizes the host pool to 0.8 of the
    available RAM after its 10 GiB reserve (hicache_hook.py:100-125,
    hicache_auto_size.py:82-125) instead of ratio 2.0 × the device pool."""
    levers = {"tp_size": 8, "enable_hierarchical_cache": True}
    assert _preflight(levers, 1000) == []
    (msg,) = _preflight(levers, 8)
    assert msg.startswith("enable_hierarchical_cache: the hierarchical cache is auto-sized")
    # An explicit ratio is still checked as SGLang checks it (tests/unit/test_hicache_ratio.py).


def test_a_running_auto_sized_host_cache_frees_what_sglang_gave_it() -> None:
    """SGLang auto-sized the running server's host pool at its start to 0.8 × 0.95 of the
    RAM then available after 10 GiB (hicache_auto_size.py:96-97, pool_host/base.py:84-108):
    with 100 GiB available now, that was P = 0.76 × (100 + P − 10) GiB = 285 GiB — not
    ratio 2.0 × the device pool (2,021 GiB at TP8)."""
    running = {"tp_size": 8, "enable_hierarchical_cache": True}
    now = preflight.HostFacts(100 * GiB, "host")
    host, freed = preflight.running_host_pool(running, H200, now)
    assert host == now
    assert abs(freed - 0.76 * 90 / 0.24 * GiB) < 8 * MiB
    # A new explicit pool is checked against now + freed − 10 GiB = 375 GiB = 402.7 GB.
    gpus = [GpuInfo(i, f"GPU-{i}", "NVIDIA H200", H200) for i in range(8)]

    def check(size_gb: int) -> list[str]:
        problems = preflight.check(
            LeverSet({"model_path": "m", "tp_size": 8, "enable_hierarchical_cache": True,
                      "hicache_size": size_gb}),
            managed=gpus, samples=None, member_pids=set(), pids_are_local=False, host=host,
            freed_on_stop_bytes=freed, server_host="127.0.0.1", server_port=1,
            port_is_ours=True,
        )  # fmt: skip
        return [p.lever for p in problems]

    assert check(50) == []  # 400 GB
    assert check(51) == ["hicache_size"]  # 408 GB
    # The simulated host's RAM is what is free with nothing running: the running pool
    # (0.76 × 90 GiB = 68.4 GiB) is taken out, and given back at the stop.
    sim_host, sim_freed = preflight.running_host_pool(
        running, H200, preflight.HostFacts(100 * GiB, "simulated")
    )
    assert abs(sim_freed - 0.76 * 90 * GiB) < 8 * MiB
    assert abs(sim_host.available_ram_bytes + sim_freed - 100 * GiB) < 8 * MiB


def test_docs_table_is_generated_from_these_cases() -> None:
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, str(root / "scripts" / "planner-table.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_api_plan_reaches_the_simulator_only_through_the_backend() -> None:
    """Model resolution belongs to the backend: api/plan.py imports no sglang_supervisor.sim."""
    root = Path(__file__).resolve().parents[2]
    tree = ast.parse((root / "api" / "plan.py").read_text())
    imported = {
        node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert not [m for m in imported if m.startswith("sglang_supervisor.sim")]


def test_swa_pool_is_sized_from_the_request_cap_without_the_radix_cache() -> None:
    """gpt-oss TP8, disable_radix_cache, max_running_requests 64: SWA slots = 64 × (128
    window + 128 eviction interval + 1 page + 1 decode page) + 2 × 8192 + 1 = 32,897
    (pool_configurator.py:924-968); the full pool gets the rest at 4,608 B/token
    (:1005-1032). The decode graphs are capped at 64 requests (memory_hook.py:182-188):
    512 + 12288 + 1024 + 64 × 2 + 464 = 14416 MiB reserved, fraction 0.900."""
    levers = {"tp_size": 8, "disable_radix_cache": True, "max_running_requests": 64}
    cap = planner.capacity(planner_model("gpt-oss-120b"), levers, H200, 4096)
    assert cap.swa_tokens_per_rank == 32_897
    assert cap.mem_fraction_static == round((143771 - 14416) / 143771, 3) == 0.9
    budget = 0.9 * H200 - 65_248_815_744 // 8
    assert cap.kv_tokens_per_rank == int((budget - 32_897 * 4608) // 4608)


#: (model, levers, SGLang 0.5.23's resolved mem_fraction_static and per-worker
#: chunked_prefill_size): scripts/sglang-oracle.py's answers (its whole resolution
#: pipeline, an H200 supplied), the rule at memory_hook.py:291-328.
ORACLE = [
    ("DeepSeek-V3", {"tp_size": 8, "attn_dp_size": 8, "chunked_prefill_size": 4096}, 0.801, 512),
    ("DeepSeek-V3", {"tp_size": 8, "attn_dp_size": 8, "cuda_graph_max_bs_decode": 128}, 0.87, 1024),
    ("DeepSeek-V3", {"tp_size": 8, "attn_dp_size": 4, "moe_a2a_backend": "deepep"}, 0.801, 2048),
    ("Llama-3.1-70B", {"tp_size": 4, "max_running_requests": 128}, 0.902, 8192),
    ("Llama-3.1-70B", {"tp_size": 8, "attn_dp_size": 2}, 0.861, 4096),
    ("Llama-3.1-70B", {"tp_size": 8, "cuda_graph_backend_prefill": "full"}, 0.893, 8192),
    ("gpt-oss-120b", {"tp_size": 8, "disable_cuda_graph": True}, 0.904, 8192),
    ("Qwen3-Next-80B-A3B", {"tp_size": 8, "pp_size": 2}, 0.89, 8192),
]


@pytest.mark.parametrize(("name", "levers", "fraction", "chunk"), ORACLE)
def test_default_fraction_and_chunk_match_sglangs_pipeline(
    name: str, levers: dict[str, Any], fraction: float, chunk: int
) -> None:
    model = capacity.SIM_MODEL if name == "Llama-3.1-70B" else planner_model(name)
    cap = planner.capacity(model, levers, H200, 4096)
    assert (cap.mem_fraction_static, cap.chunked_prefill_size) == (fraction, chunk)


def test_pools_are_whole_pages() -> None:
    """pool_configurator.py:641-646: max_total_num_tokens // page_size * page_size —
    DeepSeek-V3 TP8 page 64: 695,635 → 695,616; gpt-oss's SWA pool is the ratio of the
    aligned full pool, aligned again (:879-881)."""
    dsv3 = planner.capacity(planner_model("DeepSeek-V3"), {"tp_size": 8, "page_size": 64}, H200, 1)
    assert dsv3.kv_tokens_per_rank == 695_635 // 64 * 64 == 695_616
    gpt = planner.capacity(planner_model("gpt-oss-120b"), {"tp_size": 8, "page_size": 16}, H200, 1)
    assert gpt.kv_tokens_per_rank % 16 == 0
    assert gpt.swa_tokens_per_rank == int(gpt.kv_tokens_per_rank * 0.8) // 16 * 16


def test_qwen3_next_proposal_respects_the_extra_buffer_request_cap() -> None:
    """The proposed max_running_requests is the state slots / 5 at SGLang's default
    strategy (kv_cache_configurator.py:3062-3088, :3134-3151): 5,863 // 5 = 1,172 at the
    proposed 0.928 — it was 1,954 (slots / 3), which SGLang would cap at start."""
    hw = planner.Hardware(gpus=8, gpu_memory_bytes=H200, host_ram_available_bytes=512 * GiB)
    plan = planner.propose(planner_model("Qwen3-Next-80B-A3B"), hw, {"tp_size": 8}, avg_tokens=1000)
    assert plan.proposed.mamba_slots_per_rank == 5863
    assert plan.levers["max_running_requests"] == 5863 // 5 == 1172
