"""Multimodal checkpoints as SGLang 0.5.23 sizes them: the vision tower's cut of the
default ``mem_fraction_static`` and the multimodal cache kept out of the KV budget.

(Paths under ``sglang/srt/``.)

* SGLang builds a model multimodal (``ModelConfig.is_multimodal``,
  ``configs/model_config.py:820-827``) when its architecture is on its multimodal list
  (``:2391-2480``) or its config nests a text config (``hf_config is not
  hf_text_config``, ``:809-815``), unless multimodal is off: ``--enable-multimodal``
  unset leaves it off for Gemma-3, Llama-4, Step3-VL and Inkling (``:690-717``);
  ``--language-model-only`` serves the text model alone (``:674-676``).
* With a vision tower (``vision_config``) and ``mem_fraction_static`` unset, SGLang
  lowers its default fraction (``arg_groups/memory_hook.py:280-336``, unless
  ``--language-only``, ``--language-model-only`` or a decode server of PD
  disaggregation): the rounded fraction × 0.95 × ``clamp(1 − 0.1 × (layers × hidden² /
  (24 × 1024²) − 1), 0.8, 1.05)`` (``adjust_mem_fraction_for_vlm``, ``:417-462``),
  *not* rounded again. MoonViT (Kimi-K2.5: 27 layers of 1152) gives × 0.90974.
* A multimodal model keeps ``SGLANG_VLM_CACHE_SIZE_MB`` (100 MiB by default) of the KV
  budget for its embedding cache (``mem_cache/kv_cache_configurator.py:202-223``,
  ``:3034-3038``; ``environ.py:1598``), ``--language-only`` included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sglang_supervisor.planner.inputs import lever_bool
from sglang_supervisor.units import MiB

#: SGLang's ``multimodal_model_archs`` (``configs/model_config.py:2391-2480``).
MULTIMODAL_ARCHS = frozenset(
    {
        "CLIPModel",
        "Cohere2VisionForConditionalGeneration",
        "Cosmos3EdgeForConditionalGeneration",
        "DeepseekVL2ForCausalLM",
        "Ernie4_5_VLMoeForConditionalGeneration",
        "MiniMaxM3SparseForConditionalGeneration",
        "Gemma3ForConditionalGeneration",
        "Gemma3nForConditionalGeneration",
        "Gemma4ForConditionalGeneration",
        "EmbeddingGemma2Model",
        "Gemma4UnifiedForConditionalGeneration",
        "DiffusionGemmaForBlockDiffusion",
        "Glm4vForConditionalGeneration",
        "Glm4vMoeForConditionalGeneration",
        "Glm5NextForConditionalGeneration",
        "GlmOcrForConditionalGeneration",
        "GlmAsrForConditionalGeneration",
        "GlmImageForConditionalGeneration",
        "Grok1VForCausalLM",
        "Grok1AForCausalLM",
        "LlavaLlamaForCausalLM",
        "Llama4ForConditionalGeneration",
        "LlavaMistralForCausalLM",
        "LlavaQwenForCausalLM",
        "LlavaForConditionalGeneration",
        "LlavaVidForCausalLM",
        "Lfm2VlForConditionalGeneration",
        "LightOnOCRForConditionalGeneration",
        "MiMoV2ForCausalLM",
        "MiMoV2ASRForCausalLM",
        "MiniCPMO",
        "MiniCPMV",
        "Mistral3ForConditionalGeneration",
        "MultiModalityCausalLM",
        "MllamaForConditionalGeneration",
        "MossVLForConditionalGeneration",
        "NemotronH_Nano_VL_V2",
        "NemotronH_Nano_Omni_Reasoning_V3",
        "NemotronH_Omni_Reasoning_V3",
        "MuseGlimmerForConditionalGeneration",
        "MuseSparkForConditionalGeneration",
        "PixtralForConditionalGeneration",
        "Qwen2AudioForConditionalGeneration",
        "Qwen2VLForConditionalGeneration",
        "Qwen2_5_VLForConditionalGeneration",
        "Qwen3VLForConditionalGeneration",
        "Qwen3VLMoeForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen4ExpForConditionalGeneration",
        "InternS2PreviewForConditionalGeneration",
        "InternS2MobiusForConditionalGeneration",
        "Qwen3ASRForConditionalGeneration",
        "Qwen3OmniMoeForConditionalGeneration",
        "KimiVLForConditionalGeneration",
        "LocateAnythingForConditionalGeneration",
        "InternVLChatModel",
        "InternS1ForConditionalGeneration",
        "InternS1ProForConditionalGeneration",
        "Phi4MMForCausalLM",
        "VoxtralForConditionalGeneration",
        "WhisperForConditionalGeneration",
        "Step3VLForConditionalGeneration",
        "POINTSV15ChatModel",
        "DotsVLMForCausalLM",
        "Dots3NoteForCausalLM",
        "DotsOCRForCausalLM",
        "Sarashina2VisionForCausalLM",
        "NVILAForConditionalGeneration",
        "NVILALiteForConditionalGeneration",
        "DeepseekOCRForCausalLM",
        "UnlimitedOCRForCausalLM",
        "JetVLMForConditionalGeneration",
        "PaddleOCRVLForConditionalGeneration",
        "MiDashengLMModel",
        "StepVLForConditionalGeneration",
        "Step3p7ForConditionalGeneration",
        "KimiK25ForConditionalGeneration",
        "BailingMMNativeForConditionalGeneration",
        "BailingMM2NativeForConditionalGeneration",
        "BailingMoeV3VLForConditionalGeneration",
    }
)
#: Multimodal architectures SGLang serves as text only unless ``--enable-multimodal``
#: (``configs/model_config.py:690-702``).
TEXT_ONLY_BY_DEFAULT = frozenset(
    {
        "Gemma3ForConditionalGeneration",
        "Llama4ForConditionalGeneration",
        "Step3VLForConditionalGeneration",
        "InklingForConditionalGeneration",
    }
)
#: Multimodal architectures whose breakable prefill CUDA graphs SGLang keeps
#: (``configs/model_config.py:2497-2517``); any other multimodal model captures none
#: (``arg_groups/cuda_graph_hook.py:229-238``).
PREFILL_GRAPH_ARCHS = frozenset(
    {
        "MiniMaxM3SparseForConditionalGeneration",
        "Cohere2VisionForConditionalGeneration",
        "Glm5NextForConditionalGeneration",
        "InternS2MobiusForConditionalGeneration",
        "PaddleOCRVLForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "Qwen4ExpForConditionalGeneration",
        "MuseGlimmerForConditionalGeneration",
        "MuseSparkForConditionalGeneration",
        "KimiK3ForConditionalGeneration",
        "KimiK25ForConditionalGeneration",
        "MiniMaxM3SparseForCausalLM",
    }
)
#: Sub-configs whose presence makes SGLang's text config differ from the model's
#: (``utils/hf_transformers/common.py:547-600``, ``get_hf_text_config``).
TEXT_SUBCONFIGS = ("text_config", "llm_config", "language_config", "thinker_config")
#: Vision-tower sizes SGLang's own config classes fill in where config.json spells them
#: otherwise: Kimi-K2.5's ``KimiK25VisionConfig`` reads ``num_hidden_layers`` and
#: ``hidden_size`` (27 and 1152 by default), never the checkpoint's ``vt_*`` keys
#: (``configs/kimi_k25.py:41-64``).
VISION_DEFAULTS = {"kimi_k25": (27, 1152)}
#: ``adjust_mem_fraction_for_vlm``'s defaults for a config without the keys, and its
#: baseline ViT-L/14 (``arg_groups/memory_hook.py:437-447``).
VIT_DEFAULT_LAYERS, VIT_DEFAULT_HIDDEN = 24, 1024
#: ``SGLANG_VLM_CACHE_SIZE_MB``'s default (``environ.py:1598``).
DEFAULT_VLM_CACHE_MB = 100


@dataclass(frozen=True)
class Multimodal:
    """What SGLang's memory rule reads of a multimodal checkpoint."""

    architecture: str
    #: The vision tower's layers and width as SGLang reads them (None: no vision_config).
    vision_layers: int | None
    vision_hidden: int | None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Multimodal | None:
        """The multimodal facts of a config.json mapping; None for a text-only model."""
        archs = config.get("architectures")
        arch = str(archs[0]) if isinstance(archs, list) and archs else ""
        nested = any(isinstance(config.get(k), Mapping) for k in TEXT_SUBCONFIGS)
        if arch not in MULTIMODAL_ARCHS and not nested:
            return None
        vision = config.get("vision_config")
        if not isinstance(vision, Mapping):
            return cls(arch, None, None)
        layers, hidden = VISION_DEFAULTS.get(
            str(config.get("model_type") or ""), (VIT_DEFAULT_LAYERS, VIT_DEFAULT_HIDDEN)
        )
        return cls(
            arch, _int(vision, "num_hidden_layers", layers), _int(vision, "hidden_size", hidden)
        )

    def served(self, levers: Mapping[str, Any]) -> bool:
        """Whether SGLang builds it multimodal with ``levers`` (``is_multimodal``)."""
        if lever_bool(levers, "language_model_only"):
            return False
        explicit = levers.get("enable_multimodal")
        if explicit is not None:
            return lever_bool(levers, "enable_multimodal")
        return self.architecture not in TEXT_ONLY_BY_DEFAULT

    def vlm_factor(self, levers: Mapping[str, Any]) -> float:
        """What SGLang multiplies its default fraction by for ``levers`` (1.0: nothing)."""
        if not self.served(levers) or self.vision_layers is None or self.vision_hidden is None:
            return 1.0
        if lever_bool(levers, "language_only"):
            return 1.0
        if str(levers.get("disaggregation_mode") or "null") == "decode":
            return 1.0
        complexity = self.vision_layers * self.vision_hidden**2 / (VIT_DEFAULT_LAYERS * 1024**2)
        dynamic = max(0.8, min(1.05, 1.0 - 0.1 * (complexity - 1.0)))
        return 0.95 * dynamic

    def cache_reserve_bytes(self, levers: Mapping[str, Any], env: Mapping[str, str]) -> int:
        """Bytes SGLang keeps out of each rank's KV budget for the multimodal caches:
        ``SGLANG_VLM_CACHE_SIZE_MB`` (+ ``SGLANG_MM_FEATURE_CACHE_MB`` with a CUDA
        feature transport); 0 when it is served as text only."""
        if not self.served(levers):
            return 0
        mib = _env_int(env, "SGLANG_VLM_CACHE_SIZE_MB", DEFAULT_VLM_CACHE_MB)
        if str(levers.get("mm_feature_transport") or "") in ("cuda_ipc", "cuda_vmm"):
            mib += _env_int(env, "SGLANG_MM_FEATURE_CACHE_MB", 0)
        return max(0, mib) * MiB

    def prefill_graphs(self, levers: Mapping[str, Any]) -> bool:
        """Whether SGLang keeps breakable prefill CUDA graphs for it."""
        return not self.served(levers) or self.architecture in PREFILL_GRAPH_ARCHS


def _int(cfg: Mapping[str, Any], key: str, default: int) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return default
    return int(value)


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(str(env.get(name, default)).strip())
    except ValueError:
        return default
