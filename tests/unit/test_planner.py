"""The planner's math against hand-computed values, and its proposal's guarantees.

The configs are public ``config.json`` values; the expected bytes per token are computed
by hand from the formulas in docs/planner.md, not by the code under test.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_supervisor import planner
from sglang_supervisor.host import preflight
from sglang_supervisor.planner import GB, Hardware, LiveLoad, PlanError
from sglang_supervisor.sglang.levers import LeverSet, check_levers
from sglang_supervisor.sglang.schema import load_bundled
from tests.planner_evidence import kv_bound

MiB = 1 << 20
GiB = 1 << 30
H200 = 143771 * MiB
H100 = 81559 * MiB

DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_nextn_predict_layers": 1,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
}
KIMI_K2: dict[str, Any] = {
    **DEEPSEEK_V3,
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "kimi_k2",
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_routed_experts": 384,
    "first_k_dense_replace": 1,
    "vocab_size": 163840,
    "max_position_embeddings": 131072,
    "num_nextn_predict_layers": 0,
}
LLAMA_31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
QWEN25_72B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
QWEN3_235B_A22B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
    "num_hidden_layers": 94,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
    "head_dim": 128,  # not hidden_size // heads (= 64)
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
MODELS = {
    "DeepSeek-V3": DEEPSEEK_V3,
    "Kimi-K2": KIMI_K2,
    "Llama-3.1-8B": LLAMA_31_8B,
    "Qwen2.5-72B": QWEN25_72B,
    "Qwen3-235B-A22B": QWEN3_235B_A22B,
}

# (model, tp, bf16 bytes per token per rank), computed by hand:
#   MLA: (512 + 64) × 61 layers × 2 B = 70,272 at every TP.
#   Llama-3.1-8B: 2 × 32 × (8 // tp) × 128 × 2 = 131,072 / 32,768 / 16,384.
#   Qwen2.5-72B: 2 × 80 × (8 // tp) × 128 × 2 = 327,680 / 81,920 / 40,960.
#   Qwen3-235B: 2 × 94 × max(1, 4 // tp) × 128 × 2 = 192,512 / 48,128 / 48,128 (replicated).
CELLS = [
    ("DeepSeek-V3", 1, 70_272),
    ("DeepSeek-V3", 4, 70_272),
    ("DeepSeek-V3", 8, 70_272),
    ("Kimi-K2", 1, 70_272),
    ("Kimi-K2", 4, 70_272),
    ("Kimi-K2", 8, 70_272),
    ("Llama-3.1-8B", 1, 131_072),
    ("Llama-3.1-8B", 4, 32_768),
    ("Llama-3.1-8B", 8, 16_384),
    ("Qwen2.5-72B", 1, 327_680),
    ("Qwen2.5-72B", 4, 81_920),
    ("Qwen2.5-72B", 8, 40_960),
    ("Qwen3-235B-A22B", 1, 192_512),
    ("Qwen3-235B-A22B", 4, 48_128),
    ("Qwen3-235B-A22B", 8, 48_128),
]


def shape(name: str) -> planner.ModelShape:
    return planner.ModelShape.from_config(MODELS[name])


@pytest.mark.parametrize(("name", "tp", "bf16"), CELLS)
def test_cell_bytes_bf16_and_fp8(name: str, tp: int, bf16: int) -> None:
    s = shape(name)
    assert planner.cell_bytes(s, tp, "auto") == bf16
    assert planner.cell_bytes(s, tp, "bfloat16") == bf16
    assert planner.cell_bytes(s, tp, "fp8_e4m3") == bf16 // 2
    assert planner.cell_bytes(s, tp, "fp8_e5m2") == bf16 // 2


def test_deepseek_v3_reference_matches_sglang_log() -> None:
    # 10,000 tokens of DeepSeek-V3's bf16 KV = 0.70 GB (SGLang logs "0.65 GB" in GiB).
    cell = planner.cell_bytes(shape("DeepSeek-V3"), 8, None)
    assert cell == 70_272
    assert round(10_000 * cell / GiB, 2) == 0.65


def test_attention_kinds_and_head_dim() -> None:
    assert shape("DeepSeek-V3").attention == "MLA"
    assert shape("Llama-3.1-8B").attention == "GQA"
    assert shape("Qwen3-235B-A22B").head_dim == 128  # from the config, not 4096 // 64
    assert planner.ModelShape.from_config({**LLAMA_31_8B, "num_key_value_heads": 32}).attention == (
        "MHA"
    )


def test_pipeline_parallel_rank_holds_its_layers() -> None:
    # 32 layers over 3 stages: the fullest stage has 11.
    assert planner.cell_bytes(shape("Llama-3.1-8B"), 1, None, pp_size=3) == 2 * 11 * 8 * 128 * 2


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("DeepSeek-V3", 671e9),
        ("Kimi-K2", 1.03e12),
        ("Llama-3.1-8B", 8.03e9),
        ("Qwen2.5-72B", 72.7e9),
        ("Qwen3-235B-A22B", 235e9),
    ],
)
def test_parameter_estimate_within_3_percent(name: str, params: float) -> None:
    linear, embed = planner.estimate_params(MODELS[name])
    assert (linear + embed) == pytest.approx(params, rel=0.03)


def test_weight_estimate_uses_the_quantized_width() -> None:
    fp8_bytes, how = planner.estimate_weight_bytes(DEEPSEEK_V3)
    assert "estimated" in how and "fp8" in how
    assert fp8_bytes == pytest.approx(671e9 * 1.0, rel=0.05)  # ~1 byte per parameter
    bf16_bytes, _ = planner.estimate_weight_bytes(LLAMA_31_8B)
    assert bf16_bytes == pytest.approx(2 * 8.03e9, rel=0.03)


def test_weights_from_index_then_files_then_estimate(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B))
    m = planner.load_model_dir(tmp_path)
    assert m.weight_source.startswith("estimated")
    for i, size in enumerate((3_000_000, 5_000_000)):
        with open(tmp_path / f"model-0000{i}.safetensors", "wb") as f:
            f.truncate(size)  # sparse: the size is what counts
    m = planner.load_model_dir(tmp_path)
    assert (m.weight_bytes, m.weight_source) == (8_000_000, "the sizes of 2 *.safetensors files")
    index = {"metadata": {"total_size": 16_060_522_496}, "weight_map": {}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    m = planner.load_model_dir(tmp_path)
    assert m.weight_bytes == 16_060_522_496
    assert m.weight_source == "model.safetensors.index.json metadata.total_size"
    assert planner.weight_bytes_per_rank(m, 4) == 16_060_522_496 // 4


def test_bad_model_inputs_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"has no config\.json"):
        planner.load_model_dir(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(PlanError, match="not valid JSON"):
        planner.load_model_dir(tmp_path)
    with pytest.raises(PlanError, match="num_hidden_layers"):
        planner.ModelShape.from_config({"hidden_size": 8})
    with pytest.raises(PlanError, match="qk_rope_head_dim"):
        planner.ModelShape.from_config({**LLAMA_31_8B, "kv_lora_rank": 512})


def test_kv_tokens_formula() -> None:
    # (0.85 × 140.4 GiB − 17.65 GB) / 40,960 B, floored.
    assert planner.kv_tokens(H200, 0.85, 17_650_000_000, 40_960) == 2_697_548
    assert planner.kv_tokens(H200, 0.1, 17_650_000_000, 40_960) == 0


def test_fp8_doubles_and_fraction_adds_delta_over_cell() -> None:
    m = planner.model_from_config(QWEN25_72B, name="q", source="t")
    bf16 = planner.pool_tokens(m, {"tp_size": 4, "mem_fraction_static": 0.85}, H200)
    fp8 = planner.pool_tokens(
        m, {"tp_size": 4, "mem_fraction_static": 0.85, "kv_cache_dtype": "fp8_e4m3"}, H200
    )
    assert fp8 == pytest.approx(2 * bf16, abs=2)
    more = planner.pool_tokens(m, {"tp_size": 4, "mem_fraction_static": 0.90}, H200)
    assert more - bf16 == pytest.approx(0.05 * H200 / 81_920, abs=1)


def test_sglang_default_fraction_by_hand() -> None:
    # H200, TP 8, everything default: 512 + 8192 × 1.5 + 8/8 × 1024 + 512 × 2 + 58 prefill
    # graph sizes × 8 = 15,312 MiB reserved; (143,771 − 15,312) / 143,771 = 0.8935.
    llama = planner.ModelShape.from_config(LLAMA_31_8B)
    r = planner.sglang_reserve(H200, {"tp_size": 8}, llama)
    assert r.total_mib == 15_312
    assert r.sglang_default_fraction == 0.893
    # The 10 GiB floor: 4096-token chunks on one H100 reserve only 7,680 MiB by the sum.
    r = planner.sglang_reserve(H100, {"chunked_prefill_size": 4096}, llama)
    assert sum(r.parts_mib.values()) < 10_240 and r.total_mib == 10_240
    assert r.safe_fraction == 0.874  # floor((81,559 − 10,240) / 81,559, 3 decimals)
    # MLA: 1.5 GiB flat for prefill graphs; below 60 GiB there is no floor.
    r = planner.sglang_reserve(
        48 * GiB, {"tp_size": 8}, planner.ModelShape.from_config(DEEPSEEK_V3)
    )
    assert r.floor_mib == 0 and r.parts_mib["prefill_graphs"] == 1536
    assert r.total_mib == 512 + 4096 * 1.5 + 1024 + 160 * 2 + 1536
    # Graphs off: no graph reserve.
    r = planner.sglang_reserve(H100, {"disable_cuda_graph": True, "tp_size": 1}, llama)
    assert r.parts_mib["decode_graphs"] == 0 and r.parts_mib["prefill_graphs"] == 0


def test_host_pool_tokens() -> None:
    """mem_cache/pool_host/base.py:221-229: the size in whole pages, plus a padding page."""
    assert planner.host_pool_tokens(100, None, 1_000, 20_480) == 100 * GB // 20_480 + 1
    assert planner.host_pool_tokens(0, None, 1_000, 20_480) == 2_001
    assert planner.host_pool_tokens(0, 3.0, 1_000, 20_480) == 3_001
    # page 64: 3,000 tokens are 46 whole pages (2,944) + the padding page = 3,008.
    assert planner.host_pool_tokens(0, 3.0, 1_000, 20_480, page_size=64) == 47 * 64


def test_live_load_avg_tokens_and_diagnosis() -> None:
    live = LiveLoad(
        running_requests=80,
        queued_requests=93,
        token_usage=0.99,
        max_total_num_tokens=2_697_548,
    )
    assert live.avg_tokens() == round(0.99 * 2_697_548 / 80)
    assert live.diagnosis().startswith("KV-cache bound: token usage 0.99 with 80")
    assert (
        "not KV memory"
        in LiveLoad(running_requests=4, queued_requests=19, token_usage=0.2).diagnosis()
    )
    assert LiveLoad(running_requests=0, token_usage=0.0).avg_tokens() is None


def sim_70b() -> planner.ModelSpec:
    from sglang_supervisor.sim import capacity

    return capacity.SIM_MODEL


def test_proposal_for_the_simulated_default() -> None:
    hw = Hardware(gpus=8, gpu_memory_bytes=H200, host_ram_available_bytes=2048 * GiB)
    current = {"model_path": "sim/llama", "tp_size": 8, "mem_fraction_static": 0.85}
    plan = planner.propose(sim_70b(), hw, current, avg_tokens=32_000, live=kv_bound())
    assert plan.current.kv_tokens_per_rank == 2_697_548
    assert plan.levers["kv_cache_dtype"] == "fp8_e4m3"
    assert plan.levers["mem_fraction_static"] == 0.928
    assert plan.levers["chunked_prefill_size"] == 4096
    assert plan.levers["enable_hierarchical_cache"] is True
    assert plan.proposed.kv_tokens_per_rank == planner.pool_tokens(
        sim_70b(), plan.proposed_levers, H200
    )
    assert plan.proposed.concurrent_requests == plan.proposed.kv_tokens_per_rank // 32_000
    assert plan.levers["max_running_requests"] == plan.proposed.concurrent_requests
    assert plan.levers["cuda_graph_max_bs_decode"] >= plan.levers["max_running_requests"]
    check_levers(LeverSet(plan.levers), load_bundled())
    text = " ".join(plan.notes)
    assert "does not raise the number of requests decoding at once" in text
    assert "accuracy" in text
    data = plan.to_json()
    assert data["predicted"]["kv_tokens_per_rank_delta"] == (
        plan.proposed.kv_tokens_per_rank - plan.current.kv_tokens_per_rank
    )
    json.dumps(data)  # serialisable
    # Every lever has a reason; unset ones show SGLang's default as "current".
    notes = {n.lever: n for n in plan.lever_notes}
    assert set(notes) == set(plan.levers)
    assert notes["chunked_prefill_size"].current == 8192
    assert notes["chunked_prefill_size"].current_is_default


def test_target_concurrency_caps_max_running_and_says_when_short() -> None:
    hw = Hardware(gpus=8, gpu_memory_bytes=H200, host_ram_available_bytes=64 * GiB)
    plan = planner.propose(sim_70b(), hw, {"tp_size": 8}, avg_tokens=32_000, target_concurrency=50)
    assert plan.levers["max_running_requests"] == 50
    assert plan.levers["cuda_graph_max_bs_decode"] == 56  # the next capture size
    plan = planner.propose(sim_70b(), hw, {"tp_size": 8}, avg_tokens=32_000, target_concurrency=999)
    assert any("target of 999" in n for n in plan.notes)


def test_too_few_gpus_and_bad_inputs_are_refused() -> None:
    hw = Hardware(gpus=4, gpu_memory_bytes=H200, host_ram_available_bytes=64 * GiB)
    with pytest.raises(PlanError, match="needs 8 GPUs but the plan has 4"):
        planner.propose(sim_70b(), hw, {"tp_size": 8}, avg_tokens=1000)
    with pytest.raises(PlanError, match="avg_tokens"):
        planner.propose(sim_70b(), hw, {"tp_size": 4}, avg_tokens=0)


def test_no_host_cache_without_host_ram_and_a_too_large_one_shrinks() -> None:
    hw = Hardware(gpus=8, gpu_memory_bytes=H200, host_ram_available_bytes=32 * GiB)
    plan = planner.propose(sim_70b(), hw, {"tp_size": 8}, avg_tokens=4096)
    assert "enable_hierarchical_cache" not in plan.levers
    current = {"tp_size": 8, "enable_hierarchical_cache": True, "hicache_size": 500}
    hw = Hardware(gpus=8, gpu_memory_bytes=H200, host_ram_available_bytes=1024 * GiB)
    plan = planner.propose(sim_70b(), hw, current, avg_tokens=4096)
    assert plan.levers["hicache_size"] < 500
    assert plan.levers["hicache_size"] * GB * 8 <= 1024 * GiB - preflight.SGLANG_HOST_RAM_MARGIN


def test_current_fraction_above_the_safe_one_is_lowered() -> None:
    hw = Hardware(gpus=8, gpu_memory_bytes=H200, host_ram_available_bytes=0)
    plan = planner.propose(
        sim_70b(), hw, {"tp_size": 8, "mem_fraction_static": 0.95}, avg_tokens=4096
    )
    assert plan.levers["mem_fraction_static"] <= plan.reserve["safe_fraction"] < 0.95


# --- properties ----------------------------------------------------------------------------


@st.composite
def planning_inputs(draw: st.DrawFn) -> tuple[Any, ...]:
    name = draw(st.sampled_from(sorted(MODELS)))
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    gpus = draw(st.integers(tp, 16))
    gpu_gib = draw(st.floats(16, 300))
    ram_gib = draw(st.floats(0, 8192))
    avg = draw(st.integers(1, 300_000))
    current: dict[str, Any] = {"tp_size": tp}
    if draw(st.booleans()):
        current["mem_fraction_static"] = draw(st.floats(0.3, 0.97))
    if draw(st.booleans()):
        current["kv_cache_dtype"] = draw(st.sampled_from(["auto", "fp8_e5m2", "bfloat16"]))
    if draw(st.booleans()):
        current["chunked_prefill_size"] = draw(st.sampled_from([-1, 1024, 4096, 8192, 16384]))
    if draw(st.booleans()):
        current["enable_hierarchical_cache"] = True
        current["hicache_size"] = draw(st.integers(0, 2000))
    target = draw(st.none() | st.integers(1, 5000))
    return name, gpus, int(gpu_gib * GiB), int(ram_gib * GiB), avg, current, target


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planning_inputs())
def test_proposal_never_exceeds_host_ram_or_the_safe_fraction(args: tuple[Any, ...]) -> None:
    name, gpus, gpu_bytes, ram, avg, current, target = args
    model = planner.model_from_config(MODELS[name], name=name, source="test")
    hw = Hardware(gpus=gpus, gpu_memory_bytes=gpu_bytes, host_ram_available_bytes=ram)
    try:
        plan = planner.propose(model, hw, current, avg_tokens=avg, target_concurrency=target)
    except PlanError as exc:
        # A GPU smaller than SGLang's own reserve: refused, never a fraction <= 0.
        assert "nothing is left" in str(exc)
        return
    proposed = plan.proposed_levers
    # Within SGLang's reserve for exactly these levers.
    reserve = planner.sglang_reserve(gpu_bytes, proposed, model.shape)
    assert proposed["mem_fraction_static"] <= reserve.fraction * reserve.vlm_factor
    # Never more pinned host memory than is available after SGLang's margin: the same
    # computation preflight refuses with.
    per_rank = preflight.host_pool_bytes_per_rank(proposed, gpu_bytes, ram)
    ranks = preflight.ranks(proposed)
    assert per_rank * ranks <= max(0, ram - preflight.SGLANG_HOST_RAM_MARGIN)
    assert plan.proposed.host_ram_needed_bytes <= max(0, ram - preflight.SGLANG_HOST_RAM_MARGIN)
    # Valid flags of the bundled SGLang 0.5.23.
    assert check_levers(LeverSet(plan.levers), SCHEMA).levers == plan.levers
    # Never fewer KV tokens over all pools (attention DP trades tokens per rank for pools)
    # unless the current fraction was above the safe one.
    cur_fraction = plan.current.mem_fraction_static
    if cur_fraction <= proposed["mem_fraction_static"]:
        assert (
            plan.proposed.kv_tokens_per_rank * plan.proposed.kv_pools
            >= plan.current.kv_tokens_per_rank * plan.current.kv_pools
        )
    if target is not None:
        assert proposed["max_running_requests"] <= target


SCHEMA = load_bundled()


def test_planner_does_no_io_at_import() -> None:
    # A smoke check of "pure": planning the simulated model touches no file.
    before = set(os.listdir("."))
    hw = Hardware(gpus=1, gpu_memory_bytes=H200, host_ram_available_bytes=0)
    planner.propose(sim_70b(), hw, {"tp_size": 1}, avg_tokens=1000)
    assert set(os.listdir(".")) == before
