"""The planner against SGLang 0.5.23's own figures, for the models operators run on 8×H200.

Each case's SGLang figures come from SGLang 0.5.23 itself, not from the planner:

* ``fraction``: SGLang's resolved ``mem_fraction_static``, from its own resolution pipeline
  (``ServerArgs.resolve_once``) run on a CPU host with an H200's 143771 MiB supplied
  (``scripts/sglang-oracle.py``); the arithmetic of ``arg_groups/memory_hook.py:291-328``
  is spelled out in each case's ``why``.
* ``cell``: bytes per token of ``max_total_num_tokens`` by
  ``model_executor/pool_configurator.py`` (the formula per case in ``why``).
* ``kv_tokens``: ``(fraction × total − weights per rank − state pool) // cell``
  (``mem_cache/kv_cache_configurator.py:2990-3060``, ``:3229-3408`` for the state pool),
  computed here from the case's own numbers.

``scripts/planner-table.py`` renders these cases into docs/planner.md. The models of
issue 26 (Kimi-K2.5 and the others operators run now) read their config.json from
tests/data/models (its README says where each came from); ``before`` records what the
planner said for them at 79a70ae, before it knew vision towers and DSA indexers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MiB = 1 << 20
H200 = 143771 * MiB


def _gpt_oss_layers() -> list[str]:
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(36)]


MODELS: dict[str, dict[str, Any]] = {
    # DeepSeek-V3's config.json (the fields the planner and SGLang read).
    "DeepSeek-V3": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "vocab_size": 129280,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "first_k_dense_replace": 3,
        "num_nextn_predict_layers": 1,
        "max_position_embeddings": 163840,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    },
    # openai/gpt-oss-120b: 36 layers alternating sliding (128 tokens) and full attention.
    "gpt-oss-120b": {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "num_hidden_layers": 36,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "intermediate_size": 2880,
        "num_local_experts": 128,
        "vocab_size": 201088,
        "sliding_window": 128,
        "layer_types": _gpt_oss_layers(),
        "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn", "lm_head"],
        },
    },
    # Qwen/Qwen3-Next-80B-A3B-Instruct: every 4th layer full attention, the rest GDN.
    "Qwen3-Next-80B-A3B": {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "intermediate_size": 5120,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "num_experts": 512,
        "full_attention_interval": 4,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "max_position_embeddings": 262144,
        "vocab_size": 151936,
        "torch_dtype": "bfloat16",
    },
    # nvidia/Llama-3.1-8B-Instruct-FP8 (ModelOpt): weights and KV quantized to FP8.
    "Llama-3.1-8B-FP8": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "modelopt",
            "quant_algo": "FP8",
            "kv_cache_quant_algo": "FP8",
        },
    },
}
_DATA = Path(__file__).resolve().parent / "data" / "models"
# Llama-4-Scout, gemma-3-27b and phi-4: their published config.json files, kept in
# tests/data/models (also SGLang's resolution's model directories).
MODELS["Llama-4-Scout"] = json.loads((_DATA / "llama-4-scout" / "config.json").read_text())
MODELS["gemma-3-27b"] = json.loads((_DATA / "gemma-3-27b" / "config.json").read_text())
MODELS["phi-4"] = json.loads((_DATA / "phi-4" / "config.json").read_text())
#: The models operators run now (issue 26): name -> tests/data/models directory.
DATA_DIRS = {
    "Kimi-K2.5": "kimi-k2.5",
    "Kimi-K2": "kimi-k2",
    "DeepSeek-V3.1": "deepseek-v3.1",
    "DeepSeek-V3.2": "deepseek-v3.2",
    "GLM-4.5": "glm-4.5",
    "GLM-4.6": "glm-4.6",
    "GLM-5": "glm-5",
    "Qwen3-235B-A22B": "qwen3-235b-a22b",
    "Qwen3-Coder-480B-A35B": "qwen3-coder-480b-a35b",
    "MiniMax-M2": "minimax-m2",
    "Llama-3.1-405B-FP8": "llama-3.1-405b-fp8",
    "Llama-4-Maverick": "llama-4-maverick",
}
for _name, _dir in DATA_DIRS.items():
    MODELS[_name] = json.loads((_DATA / _dir / "config.json").read_text())

#: The checkpoints' weights (``model.safetensors.index.json`` ``metadata.total_size``;
#: Llama-4-Scout, gemma-3-27b, phi-4: bf16 parameters × 2, text and vision, the figures
#: issue 20's independent check used).
WEIGHTS = {
    "DeepSeek-V3": 688_586_727_753,
    "gpt-oss-120b": 65_248_815_744,
    "Qwen3-Next-80B-A3B": 162_651_901_952,
    "Llama-3.1-8B-FP8": 9_080_000_000,
    "Llama-4-Scout": 217_896_800_000,
    "gemma-3-27b": 54_867_000_000,
    "phi-4": 29_319_000_000,
    # Issue 26's models: the checkpoints' sizes, to ±0.5% where no index was at hand
    # (tests/data/models/README.md); a shared input of the planner and SGLang's sizing.
    "Kimi-K2.5": 595_140_000_000,  # 554.27 GiB of tensors (INT4 experts, bf16 rest)
    "Kimi-K2": 1_029_000_000_000,  # fp8
    "DeepSeek-V3.1": 688_586_727_753,  # as V3 (fp8)
    "DeepSeek-V3.2": 690_300_000_000,  # V3 + the indexer's projections
    "GLM-4.5": 716_700_000_000,  # bf16, MTP layer included
    "GLM-4.6": 716_700_000_000,
    "GLM-5": 756_000_000_000,  # GLM-5-FP8
    "Qwen3-235B-A22B": 470_200_000_000,  # bf16
    "Qwen3-Coder-480B-A35B": 960_600_000_000,  # bf16
    "MiniMax-M2": 230_100_000_000,  # fp8
    "Llama-3.1-405B-FP8": 410_100_000_000,  # ModelOpt FP8
    "Llama-4-Maverick": 801_500_000_000,  # bf16, text and vision
}
#: Models whose checkpoint ships a multi-token-prediction layer, and their layers: the
#: planner counts one average layer of it out unless speculative decoding loads it.
MTP_LAYERS = {
    "DeepSeek-V3.1": 62,
    "DeepSeek-V3.2": 62,
    "GLM-4.5": 93,
    "GLM-4.6": 93,
    "GLM-5": 79,
}
#: DeepSeek-V3's MTP layer (model.layers.61.*): loaded only with speculative decoding.
DSV3_MTP = WEIGHTS["DeepSeek-V3"] // 62
#: DeepSeek-V3's attention projections, replicated on every attention-DP rank: per layer
#: q_a 7168×1536 + q_b 1536×128×192 + kv_a 7168×576 + kv_b 512×128×256 + o 128×128×7168
#: = 187,105,280 parameters × 61 layers × 1 byte (fp8).
DSV3_ATTENTION = 187_105_280 * 61
#: Kimi-K2.5's attention projections (bf16: compressed-tensors leaves ``self_attn``
#: out): q_a 7168×1536 + q_b 1536×64×192 + kv_a 7168×576 + kv_b 512×64×256 + o
#: 64×128×7168 = 101,122,048 parameters × 61 layers × 2 bytes.
KIMI_ATTENTION = 101_122_048 * 61 * 2
#: SGLang's multimodal cache (``SGLANG_VLM_CACHE_SIZE_MB`` = 100) kept out of the budget.
VLM_CACHE = 100 * MiB


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    levers: dict[str, Any]
    #: SGLang 0.5.23's resolved mem_fraction_static (its own pipeline).
    fraction: float
    #: Bytes per token of max_total_num_tokens (pool_configurator.py).
    cell: float
    #: Weights one rank loads.
    weights_per_rank: int
    why: str
    source: str
    #: Bytes of one request's linear-attention state, and SGLang's ratio (0.9).
    mamba_state: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: SGLang's max_running_requests, set at pool sizing (``resolve_max_num_reqs``,
    #: kv_cache_configurator.py:3119-3173), after the resolution pipeline.
    max_running: int | None = None
    #: Bytes SGLang keeps out of the KV budget for a multimodal model's caches.
    mm_reserve: int = 0
    #: The page SGLang resolves (64 for DSA models).
    page: int = 1
    #: What the planner said at 79a70ae: (fraction, bytes per token, KV tokens per rank).
    before: tuple[float, float, int] | None = None

    def kv_tokens(self) -> int:
        """SGLang's ``max_total_num_tokens`` from its formulas and the case's numbers."""
        budget = self.fraction * H200 - self.weights_per_rank - self.mm_reserve
        if self.mamba_state:
            # kv_cache_configurator.py:3368-3408: slots = (budget × 0.9/1.9 − s) // s,
            # the pool takes (slots + 1) × s.
            share = budget * 0.9 / 1.9
            slots = int((share - self.mamba_state) // self.mamba_state)
            budget -= (slots + 1) * self.mamba_state
        return int(budget // self.cell) // self.page * self.page


W = WEIGHTS
CASES: list[Case] = [
    Case(
        "DeepSeek-V3 TP8",
        "DeepSeek-V3",
        {"tp_size": 8},
        fraction=0.886,
        cell=(512 + 64) * 61 * 2,
        weights_per_rank=(W["DeepSeek-V3"] - DSV3_MTP) // 8,
        why="reserve 512 + 8192×1.5 + 1024 + 512×2 + 1536 (MLA prefill graphs) = 16384 MiB",
        source="memory_hook.py:309-313,368,389; pool_configurator.py:359-396",
    ),
    Case(
        "DeepSeek-V3 TP8 attention DP 8",
        "DeepSeek-V3",
        {"tp_size": 8, "attn_dp_size": 8},
        fraction=0.758,
        cell=(512 + 64) * 61 * 2,
        weights_per_rank=(W["DeepSeek-V3"] - DSV3_MTP - DSV3_ATTENTION) // 8 + DSV3_ATTENTION,
        why="16384 MiB + 512×8×3 + 512×8×1.5 (DP attention, batch > 300) = 34816 MiB; chunk "
        "8192 → 1024 per worker, conservativeness × 0.3",
        source="memory_hook.py:370-378; parallel_hook.py:314-332",
        extra={"chunked_prefill_size": 1024, "schedule_conservativeness": 0.3},
    ),
    Case(
        "DeepSeek-V3 TP8 --enable-dp-attention --dp-size 8",
        "DeepSeek-V3",
        {"tp_size": 8, "dp_size": 8, "enable_dp_attention": True},
        fraction=0.758,
        cell=(512 + 64) * 61 * 2,
        weights_per_rank=(W["DeepSeek-V3"] - DSV3_MTP - DSV3_ATTENTION) // 8 + DSV3_ATTENTION,
        why="the deprecated spelling resolves to attn_dp_size 8, dp_size 1",
        source="parallel_hook.py:39-61",
        extra={"ranks": 8},
    ),
    Case(
        "DeepSeek-V3 TP8 attention DP 8 + DeepEP + EAGLE",
        "DeepSeek-V3",
        {
            "tp_size": 8,
            "attn_dp_size": 8,
            "moe_a2a_backend": "deepep",
            "speculative_algorithm": "EAGLE",
        },
        fraction=0.736,
        cell=(512 + 64) * 61 * 2 + (512 + 64) * 2,
        weights_per_rank=(W["DeepSeek-V3"] - DSV3_ATTENTION) // 8 + DSV3_ATTENTION,
        why="34816 + 1024 (DeepEP, breakable prefill graphs) + 2048 (DeepEP all-to-all, after "
        "the floor) = 37888 MiB; the MTP draft layer widens the cell by 1/61; "
        "max_running_requests 48 (6 per worker)",
        source="memory_hook.py:316-317,391-397,402-414; pool_configurator.py:258-317; "
        "speculative_hook.py:442",
        extra={"max_running_requests": 48},
    ),
    Case(
        "DeepSeek-V3 TP8 PP2",
        "DeepSeek-V3",
        {"tp_size": 8, "pp_size": 2},
        fraction=0.890,
        cell=(512 + 64) * 31 * 2,
        weights_per_rank=(W["DeepSeek-V3"] - DSV3_MTP) // 16,
        why="512 + 12288 + 8×2/8×1024 + 1024, no prefill graphs with PP = 15872 MiB; "
        "31 of 61 layers on the fuller stage",
        source="memory_hook.py:309-313; cuda_graph_hook.py:150-161",
    ),
    Case(
        "gpt-oss-120b TP8",
        "gpt-oss-120b",
        {"tp_size": 8},
        fraction=0.893,
        cell=1 * (64 + 64) * 2 * 18 + 0.8 * 1 * (64 + 64) * 2 * 18,
        weights_per_rank=W["gpt-oss-120b"] // 8,
        why="full 256 B × 18 layers + 0.8 × SWA 256 B × 18 layers = 8294.4 B/token; reserve "
        "512 + 12288 + 1024 + 1024 + 58×8 = 15312 MiB",
        source="pool_configurator.py:703-716,786-803; memory_hook.py:386",
    ),
    Case(
        "Qwen3-Next-80B-A3B TP8",
        "Qwen3-Next-80B-A3B",
        {"tp_size": 8},
        fraction=0.893,
        cell=1 * (256 + 256) * 2 * 12,
        weights_per_rank=W["Qwen3-Next-80B-A3B"] // 8,
        mamba_state=(1024 * 3 * 2 + 4 * 128 * 128 * 4) * 36,
        why="only the 12 full-attention layers hold KV: 12288 B/token; 36 GDN layers' state "
        "(conv 1024×3 bf16 + SSM 4×128×128 fp32) = 9,658,368 B per request slot",
        source="pool_configurator.py:228-236; configs/qwen3_next.py:260-310; "
        "configs/mamba_utils.py:116-125,196-240; kv_cache_configurator.py:3368-3408",
        # SGLang's defaults resolve mamba_radix_cache_strategy=extra_buffer
        # (arg_groups/overrides.py:476-486): 3 + 2 slots per request
        # (kv_cache_configurator.py:3062-3088): 5604 slots // 5.
        max_running=1120,
    ),
    Case(
        "Llama-4-Scout TP8",
        "Llama-4-Scout",
        {"tp_size": 8},
        fraction=0.893,
        cell=1 * 256 * 2 * 12 + 0.8 * 1 * 256 * 2 * 36,
        weights_per_rank=W["Llama-4-Scout"] // 8,
        why="a hybrid sliding-window model in SGLang: 12 full layers (every 4th) + 0.8 × 36 "
        "chunked-attention layers, 512 B each = 20,889.6 B/token, not 24,576",
        source="configs/model_config.py:2651-2657,2705-2711; pool_configurator.py:656-803,"
        "1715-1725",
    ),
    Case(
        "Llama-4-Scout TP4 DP2",
        "Llama-4-Scout",
        {"tp_size": 4, "dp_size": 2},
        fraction=0.897,
        cell=2 * 256 * 2 * 12 + 0.8 * 2 * 256 * 2 * 36,
        weights_per_rank=W["Llama-4-Scout"] // 4,
        why="TP4: 2 KV heads per rank, 1024 B per layer: 41,779.2 B/token; two replicas",
        source="configs/model_config.py:2705-2711; pool_configurator.py:700-716,786-803",
    ),
    Case(
        "gemma-3-27b TP4",
        "gemma-3-27b",
        {"tp_size": 4},
        fraction=0.897,
        cell=4 * 256 * 2 * 62,
        weights_per_rank=W["gemma-3-27b"] // 4,
        why="not a hybrid-SWA model in SGLang: all 62 layers full; context 131,072 from "
        "the text config (transformers' Gemma3TextConfig default; rope factor nested per "
        "layer type) → max_running_requests = tokens / 131072 × 512",
        source="configs/model_config.py:1293,2651-2696; "
        "utils/hf_transformers/common.py:677-695; kv_cache_configurator.py:3119-3127",
        max_running=3738,
    ),
    Case(
        "Llama-3.1-8B FP8 (ModelOpt) TP1",
        "Llama-3.1-8B-FP8",
        {"tp_size": 1},
        fraction=0.903,
        cell=8 * (128 + 128) * 1 * 32,
        weights_per_rank=W["Llama-3.1-8B-FP8"],
        why="kv_cache_quant_algo FP8: auto stores fp8 (1 B): 65,536 B/token, not 131,072",
        source="mem_cache/kv_cache_dtype.py:49-57; pool_configurator.py:491-497",
        extra={"kv_cache_dtype": "fp8_e4m3"},
    ),
]


#: The vision tower's cut of SGLang's default fraction (memory_hook.py:417-462) for
#: MoonViT (27 layers of 1152) and Llama-4's vision model (34 of 1408).
MOONVIT = 0.95 * (1 - 0.1 * (27 * 1152**2 / (24 * 1024**2) - 1))
LLAMA4_VIT = 0.95 * (1 - 0.1 * (34 * 1408**2 / (24 * 1024**2) - 1))
_MLA = (512 + 64) * 61 * 2
_DSA_BF16 = ((512 + 64) * 2 + 132) * 61
_DSA_FP8 = (512 + 512 // 128 * 4 + 64 * 2 + 132) * 61


def _no_mtp(name: str) -> int:
    return W[name] - W[name] // MTP_LAYERS[name]


CASES += [
    Case(
        "Kimi-K2.5 TP8",
        "Kimi-K2.5",
        {"tp_size": 8},
        fraction=0.886 * MOONVIT,
        cell=_MLA,
        weights_per_rank=W["Kimi-K2.5"] // 8,
        why="the DeepSeek-V3 reserve (0.886), × 0.95 × (1 − 0.1 × (27 × 1152² / (24 × 1024²) "
        "− 1)) = 0.8060 for MoonViT; 100 MiB of the budget for the multimodal cache",
        source="memory_hook.py:280-336,417-462; kv_cache_configurator.py:202-223,3034-3038",
        mm_reserve=VLM_CACHE,
        before=(0.886, 70_272.0, 842_103),
    ),
    Case(
        "Kimi-K2.5 TP8 attention DP 8 + EP 8 + fp8 KV",
        "Kimi-K2.5",
        {"tp_size": 8, "attn_dp_size": 8, "ep_size": 8, "kv_cache_dtype": "fp8_e4m3"},
        fraction=0.758 * MOONVIT,
        cell=_MLA // 2,
        weights_per_rank=(W["Kimi-K2.5"] - KIMI_ATTENTION) // 8 + KIMI_ATTENTION,
        why="DeepSeek-V3's attention-DP reserve (0.758) × MoonViT's 0.90974 = 0.6896; the "
        "bf16 attention projections (12.3 GB) replicated on every rank",
        source="memory_hook.py:370-378,417-462; parallel_hook.py:314-332",
        mm_reserve=VLM_CACHE,
        before=(0.758, 35_136.0, 827_779),
    ),
    Case(
        "Kimi-K2.5 TP8 --language-only",
        "Kimi-K2.5",
        {"tp_size": 8, "language_only": True},
        fraction=0.886,
        cell=_MLA,
        weights_per_rank=W["Kimi-K2.5"] // 8,
        why="no vision tower's cut with --language-only; the multimodal cache still kept",
        source="memory_hook.py:283-288; kv_cache_configurator.py:202-223",
        mm_reserve=VLM_CACHE,
        before=(0.886, 70_272.0, 842_103),
    ),
    Case(
        "Kimi-K2 TP8",
        "Kimi-K2",
        {"tp_size": 8},
        fraction=0.886,
        cell=_MLA,
        weights_per_rank=W["Kimi-K2"] // 8,
        why="MLA 576 × 61 × 2; 1.03 TB of fp8 weights leave ≈5 GB per GPU",
        source="memory_hook.py:309-313,389; pool_configurator.py:359-396",
        before=(0.886, 70_272.0, 70_351),
    ),
    Case(
        "DeepSeek-V3.1 TP8",
        "DeepSeek-V3.1",
        {"tp_size": 8},
        fraction=0.886,
        cell=_MLA,
        weights_per_rank=_no_mtp("DeepSeek-V3.1") // 8,
        why="as DeepSeek-V3",
        source="memory_hook.py:309-313,389; pool_configurator.py:359-396",
        max_running=2173,
        before=(0.886, 70_272.0, 695_635),
    ),
    Case(
        "DeepSeek-V3.2 TP8",
        "DeepSeek-V3.2",
        {"tp_size": 8},
        fraction=0.886,
        cell=_DSA_BF16,
        weights_per_rank=_no_mtp("DeepSeek-V3.2") // 8,
        why="auto is bf16 on SM90; (576 × 2 + the indexer's 128 + 4 fp8 key bytes) × 61 = "
        "78,324 B/token; pages of 64",
        source="overrides.py:490-547; pool_configurator.py:397-409,560-634; "
        "model_overrides/deepseek_v2.py:160-173",
        page=64,
        before=(0.886, 70_272.0, 692_637),
    ),
    Case(
        "DeepSeek-V3.2 TP8 fp8 KV",
        "DeepSeek-V3.2",
        {"tp_size": 8, "kv_cache_dtype": "fp8_e4m3"},
        fraction=0.886,
        cell=_DSA_FP8,
        weights_per_rank=_no_mtp("DeepSeek-V3.2") // 8,
        why="the fp8 DSA layout: 512 fp8 + 4 scales × 4 B + rope 64 × bf16 = 656 B, + 132 "
        "index-key bytes, × 61 = 48,068 B/token",
        source="kv_cache_configurator.py:3412-3475; pool_configurator.py:560-634",
        page=64,
        before=(0.886, 35_136.0, 1_385_274),
    ),
    Case(
        "GLM-4.5 TP8",
        "GLM-4.5",
        {"tp_size": 8},
        fraction=0.893,
        cell=1 * (128 + 128) * 2 * 92,
        weights_per_rank=_no_mtp("GLM-4.5") // 8,
        why="GQA, 8 KV heads: one per rank, 512 B × 92 layers; the MTP layer not loaded",
        source="pool_configurator.py:491-497; memory_hook.py:386",
        before=(0.893, 47_104.0, 976_559),
    ),
    Case(
        "GLM-4.6 TP8",
        "GLM-4.6",
        {"tp_size": 8},
        fraction=0.893,
        cell=1 * (128 + 128) * 2 * 92,
        weights_per_rank=_no_mtp("GLM-4.6") // 8,
        why="GLM-4.5's shape with a 202,752-token context (max_running_requests 2466)",
        source="pool_configurator.py:491-497; kv_cache_configurator.py:3119-3127",
        max_running=2466,
        before=(0.893, 47_104.0, 976_559),
    ),
    Case(
        "GLM-5 TP8",
        "GLM-5",
        {"tp_size": 8},
        fraction=0.886,
        cell=((512 + 64) * 2 + 132) * 78,
        weights_per_rank=_no_mtp("GLM-5") // 8,
        why="a DSA model by SGLang's list (GlmMoeDsaForCausalLM): (1152 + 132) × 78",
        source="configs/model_config.py:191-212; pool_configurator.py:397-409,560-634",
        page=64,
        before=(0.886, 89_856.0, 448_105),
    ),
    Case(
        "Qwen3-235B-A22B TP8",
        "Qwen3-235B-A22B",
        {"tp_size": 8},
        fraction=0.893,
        cell=1 * (128 + 128) * 2 * 94,
        weights_per_rank=W["Qwen3-235B-A22B"] // 8,
        why="4 KV heads over TP8: one per rank (replicated), 512 B × 94 layers",
        source="pool_configurator.py:491-497",
        before=(0.893, 48_128.0, 1_575_986),
    ),
    Case(
        "Qwen3-Coder-480B-A35B TP8",
        "Qwen3-Coder-480B-A35B",
        {"tp_size": 8},
        fraction=0.893,
        cell=1 * (128 + 128) * 2 * 62,
        weights_per_rank=W["Qwen3-Coder-480B-A35B"] // 8,
        why="8 KV heads: one per rank, 512 B × 62 layers; 120 GB of bf16 weights per GPU",
        source="pool_configurator.py:491-497",
        before=(0.893, 31_744.0, 458_324),
    ),
    Case(
        "MiniMax-M2 TP8",
        "MiniMax-M2",
        {"tp_size": 8},
        fraction=0.893,
        cell=1 * (128 + 128) * 2 * 62,
        weights_per_rank=W["MiniMax-M2"] // 8,
        why="8 KV heads: one per rank, 512 B × 62 layers",
        source="pool_configurator.py:491-497",
        before=(0.893, 31_744.0, 3_334_852),
    ),
    Case(
        "Llama-3.1-405B FP8 (ModelOpt) TP8",
        "Llama-3.1-405B-FP8",
        {"tp_size": 8},
        fraction=0.893,
        cell=1 * (128 + 128) * 1 * 126,
        weights_per_rank=W["Llama-3.1-405B-FP8"] // 8,
        why="kv_cache_quant_algo FP8: 1 B per element, 256 B × 126 layers (Meta's own "
        "fbgemm_fp8 checkpoint is refused by SGLang 0.5.23: model_config.py:2152)",
        source="mem_cache/kv_cache_dtype.py:49-57; pool_configurator.py:491-497",
        extra={"kv_cache_dtype": "fp8_e4m3"},
        before=(0.893, 32_256.0, 2_584_373),
    ),
    Case(
        "Llama-4-Maverick TP8",
        "Llama-4-Maverick",
        {"tp_size": 8},
        fraction=0.893,
        cell=1 * 256 * 2 * 12 + 0.8 * 1 * 256 * 2 * 36,
        weights_per_rank=W["Llama-4-Maverick"] // 8,
        why="served as text only by default (no vision cut, no multimodal cache); 12 full + "
        "0.8 × 36 chunked layers",
        source="configs/model_config.py:690-702,2705-2711; pool_configurator.py:786-803",
        before=(0.893, 20_889.6, 1_648_502),
    ),
    Case(
        "Llama-4-Maverick TP8 --enable-multimodal",
        "Llama-4-Maverick",
        {"tp_size": 8, "enable_multimodal": True},
        fraction=0.897 * LLAMA4_VIT,
        cell=1 * 256 * 2 * 12 + 0.8 * 1 * 256 * 2 * 36,
        weights_per_rank=W["Llama-4-Maverick"] // 8,
        why="multimodal: no breakable prefill graphs for an arch SGLang has not validated "
        "(−464 MiB of reserve: 0.897), × 0.95 × (1 − 0.1 × (34 × 1408² / (24 × 1024²) − 1)) "
        "= 0.7091; 100 MiB of the budget for the multimodal cache",
        source="memory_hook.py:417-462; cuda_graph_hook.py:229-238",
        mm_reserve=VLM_CACHE,
        before=(0.893, 20_889.6, 1_648_502),
    ),
]


def planner_model(name: str) -> Any:
    """The case's model as the planner builds it (weights and MTP bytes given)."""
    from sglang_supervisor import planner

    mtp: int | None = DSV3_MTP if name == "DeepSeek-V3" else 0
    if name in MTP_LAYERS:
        mtp = None  # one average layer of the given weights (model_from_config)
    return planner.model_from_config(
        MODELS[name],
        name=name,
        source="tests/planner_cases.py",
        weight_bytes=WEIGHTS[name],
        weight_source="the checkpoint's index",
        mtp_weight_bytes=mtp,
    )
