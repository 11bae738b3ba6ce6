"""The model families whose sizing SGLang 0.5.23 treats apart: multimodal checkpoints (a
vision tower's cut of the default fraction, the multimodal cache) and DSA models (the
indexer's key cache, the fp8 latent's scales, their pages). SGLang's own figures for the
whole sets are in tests/planner_cases.py (and asked of SGLang itself in
tests/integration/test_planner_pools_sglang.py); these are the rules' edges, by hand
from the lines cited.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sglang_supervisor import planner
from sglang_supervisor.planner.multimodal import Multimodal
from tests.planner_cases import H200, MODELS, planner_model

MiB = 1 << 20
#: memory_hook.py:437-462 for MoonViT: 27 × 1152² / (24 × 1024²) = 1.4238.
MOONVIT = 0.95 * (1 - 0.1 * (27 * 1152**2 / (24 * 1024**2) - 1))


def _kimi_pools(**levers: Any) -> planner.Pools:
    return planner.pools(planner_model("Kimi-K2.5"), {"tp_size": 8, **levers}, H200)


def test_kimi_k25_reads_its_vision_tower_as_sglangs_config_class_does() -> None:
    """config.json spells the tower vt_num_hidden_layers / vt_hidden_size; SGLang's
    KimiK25VisionConfig reads neither and keeps its defaults, 27 and 1152
    (configs/kimi_k25.py:41-64): the cut is × 0.90974, not × 0.95 (a tower of unknown
    size would be ViT-L's 24 × 1024)."""
    mm = Multimodal.from_config(MODELS["Kimi-K2.5"])
    assert mm is not None and (mm.vision_layers, mm.vision_hidden) == (27, 1152)
    assert mm.vlm_factor({"tp_size": 8}) == pytest.approx(MOONVIT, rel=1e-15)
    assert round(MOONVIT, 5) == 0.90974


@pytest.mark.parametrize(
    ("levers", "fraction", "cache"),
    [
        ({}, 0.886 * MOONVIT, 100 * MiB),
        # memory_hook.py:283-288: no cut with --language-only, the cache stays
        # (kv_cache_configurator.py:3034-3038 reads is_multimodal only).
        ({"language_only": True}, 0.886, 100 * MiB),
        # model_config.py:674-676,820-827: text only, neither.
        ({"language_model_only": True}, 0.886, 0),
        # A decode server of PD disaggregation keeps no vision reserve.
        ({"disaggregation_mode": "decode"}, None, 100 * MiB),
        ({"enable_multimodal": False}, 0.886, 0),
    ],
)
def test_the_vision_cut_and_the_multimodal_cache_follow_the_serving_mode(
    levers: dict[str, Any], fraction: float | None, cache: int
) -> None:
    p = _kimi_pools(**levers)
    if fraction is not None:
        assert p.mem_fraction_static == fraction
    weights = p.weight_bytes_per_rank
    assert p.budget_bytes == int(p.mem_fraction_static * H200 - weights - cache)


def test_sglang_vlm_cache_size_changes_the_reserve() -> None:
    mm = Multimodal.from_config(MODELS["Kimi-K2.5"])
    assert mm is not None
    assert mm.cache_reserve_bytes({}, {"SGLANG_VLM_CACHE_SIZE_MB": "512"}) == 512 * MiB
    both = {"SGLANG_VLM_CACHE_SIZE_MB": "100", "SGLANG_MM_FEATURE_CACHE_MB": "256"}
    assert mm.cache_reserve_bytes({"mm_feature_transport": "cuda_ipc"}, both) == 356 * MiB
    assert mm.cache_reserve_bytes({}, both) == 100 * MiB  # the feature cache: CUDA only


def test_llama4_is_text_only_unless_enable_multimodal() -> None:
    """model_config.py:690-702: no cut, no cache, prefill graphs kept by default; with
    --enable-multimodal all three change (cuda_graph_hook.py:229-238)."""
    shape = planner_model("Llama-4-Maverick").shape
    text = planner.sglang_reserve(H200, {"tp_size": 8}, shape)
    vision = planner.sglang_reserve(H200, {"tp_size": 8, "enable_multimodal": True}, shape)
    assert text.vlm_factor == 1.0 and text.parts_mib["prefill_graphs"] == 58 * 8
    assert vision.parts_mib["prefill_graphs"] == 0 and vision.vlm_factor < 0.8
    assert vision.safe_fraction <= vision.sglang_default_fraction < text.sglang_default_fraction


def test_the_vision_tower_factor_is_clamped() -> None:
    """memory_hook.py:455-458: the dynamic factor stays within [0.8, 1.05]."""
    huge = Multimodal("Qwen2_5_VLForConditionalGeneration", 64, 4096)
    tiny = Multimodal("Qwen2_5_VLForConditionalGeneration", 2, 128)
    assert huge.vlm_factor({}) == pytest.approx(0.95 * 0.8)
    assert tiny.vlm_factor({}) == pytest.approx(0.95 * 1.05)
    assert Multimodal("Qwen2AudioForConditionalGeneration", None, None).vlm_factor({}) == 1.0


def test_a_text_model_is_not_multimodal() -> None:
    assert planner_model("DeepSeek-V3").shape.multimodal is None
    assert planner_model("Llama-3.1-405B-FP8").shape.multimodal is None


def _dsa(**fields: Any) -> dict[str, Any]:
    config = copy.deepcopy(MODELS["DeepSeek-V3.2"])
    config.update(fields)
    return config


def test_dsa_cells_by_hand() -> None:
    """pool_configurator.py:397-409,560-634 and kv_cache_configurator.py:3412-3475."""
    shape = planner.ModelShape.from_config(_dsa())
    assert shape.dsa is not None and shape.dsa.bytes_per_layer() == 128 + 4
    bf16 = planner.cells(shape, {"tp_size": 8})
    assert bf16.kv_cache_dtype == "bfloat16"  # auto on SM90: overrides.py:533-537
    assert bf16.exact == (576 * 2 + 132) * 61 == 78_324
    assert planner.cells(shape, {"kv_cache_dtype": "fp8_e4m3"}).exact == 788 * 61 == 48_068
    # TRT-LLM's DSA backends read the raw layout: no scales on the fp8 latent.
    raw = {"kv_cache_dtype": "fp8_e4m3", "dsa_decode_backend": "trtllm"}
    assert planner.cells(shape, raw).exact == (576 + 132) * 61
    # Without index_topk it is plain MLA (is_deepseek_dsa, model_config.py:191-212).
    plain = _dsa()
    del plain["index_topk"]
    assert planner.cells(planner.ModelShape.from_config(plain), {}).exact == 576 * 2 * 61


def test_shared_indexer_layers_keep_no_keys() -> None:
    """model_config.py:488-521: a layer that reuses the previous top-k keeps no index keys
    (kv_cache_configurator.py:131-145 elides them); indexer_types, or the frequency and
    offset that generate the same list (GLM-5.2's), give the same count."""
    freq = planner.ModelShape.from_config(_dsa(index_topk_freq=4, index_skip_topk_offset=3))
    types = ["shared" if max(i - 3 + 1, 0) % 4 else "full" for i in range(61)]
    listed = planner.ModelShape.from_config(_dsa(indexer_types=types))
    assert freq.dsa is not None and listed.dsa is not None
    assert freq.dsa.indexer_layers == listed.dsa.indexer_layers == types.count("full") == 17
    cell = planner.cells(freq, {})
    assert cell.exact == 576 * 2 * 61 + 132 * 17
    # HiSparse keeps keys for every layer.
    assert planner.cells(freq, {"enable_hisparse": True}).indexer_bytes == 132 * 61


def test_dsa_pools_are_paged_by_64() -> None:
    """model_overrides/deepseek_v2.py:160-173: 64 × index_kpool tokens a page."""
    p = planner.pools(planner_model("DeepSeek-V3.2"), {"tp_size": 8}, H200)
    assert p.kv_tokens % 64 == 0 and p.kv_tokens == 621_376
    paged = planner.pools(planner_model("DeepSeek-V3.2"), {"tp_size": 8, "page_size": 1}, H200)
    assert paged.kv_tokens == int(p.kv_budget_bytes // p.cells.exact)


def test_kimi_k25_weights_are_estimated_within_one_percent() -> None:
    """Without its index: INT4 experts with a bf16 scale per group of 32 (0.5625 B each),
    the attention compressed-tensors leaves out in bf16; the checkpoint holds 554.27 GiB."""
    total, how = planner.estimate_weight_bytes(MODELS["Kimi-K2.5"])
    assert total == pytest.approx(554.27 * (1 << 30), rel=0.01)
    assert "4-bit" in how


def test_sglangs_resolved_storage_replaces_the_hopper_assumption() -> None:
    """Where SGLang answers (a Blackwell host: auto is fp8 with TRT-LLM's DSA backends,
    overrides.py:533-537,721-727), its resolved dtype and backends size the cell; an
    operator's own kv_cache_dtype wins over them."""
    model = planner_model("DeepSeek-V3.2")
    blackwell = {
        "kv_cache_dtype": "fp8_e4m3",
        "dsa_prefill_backend": "trtllm",
        "dsa_decode_backend": "trtllm",
    }
    cap = planner.capacity(model, {"tp_size": 8}, H200, 4096, resolved=blackwell)
    assert cap.kv_cache_dtype == "fp8_e4m3" and cap.cell_bytes == (576 + 132) * 61
    own = {"tp_size": 8, "kv_cache_dtype": "bfloat16"}
    assert planner.capacity(model, own, H200, 4096, resolved=blackwell).cell_bytes == 78_324


@pytest.mark.parametrize(
    ("name", "checkpoint"),
    [
        ("Llama-4-Scout", 217_896_800_000),  # 108.9e9 bf16 parameters, text and vision
        ("Llama-4-Maverick", 801_500_000_000),  # every 2nd layer MoE (interleave step 2)
    ],
)
def test_llama4_weights_are_estimated_with_the_shared_expert_and_interleaving(
    name: str, checkpoint: int
) -> None:
    """Llama-4's MoE layers carry a shared expert of intermediate_size; Maverick's dense
    layers (every other one) use intermediate_size_mlp; the vision tower is in the
    checkpoint. At 79a70ae Scout was 203.5 GB (→ 5,227,082 KV tokens per rank at TP8,
    +1.7% on SGLang's 5,140,689) and Maverick 1,556 GB (nothing fit)."""
    total, _ = planner.estimate_weight_bytes(MODELS[name])
    assert total == pytest.approx(checkpoint, rel=0.005)
    if name == "Llama-4-Scout":
        model = planner.model_from_config(MODELS[name], name=name, source="config.json")
        tokens = planner.pools(model, {"tp_size": 8}, H200).kv_tokens
        assert tokens == pytest.approx(5_140_689, rel=0.005)
