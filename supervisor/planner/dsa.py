"""DeepSeek sparse attention (DeepSeek-V3.2, GLM-5): the indexer's key cache and the
latent's layout, as SGLang 0.5.23 sizes them per token.

(Paths under ``sglang/srt/``.)

* A DSA model is one of SGLang's DSA architectures with ``index_topk`` in its config
  (``configs/model_config.py:191-212``).
* Each layer that computes its own top-k keeps ``ceil((index_head_dim + index_head_dim /
  128 × 4) / index_kpool)`` bytes of index keys per token (fp8 values and a 4-byte scale
  per 128; ``model_executor/pool_configurator.py:560-634``, ``DSATokenToKVPool``
  ``mem_cache/memory_pool.py:5280-5282``), beside the MLA latent
  (``pool_configurator.py:397-409``); with HiSparse or the external linker every layer
  keeps one (``mem_cache/kv_cache_configurator.py:131-145``).
* With ``kv_cache_dtype=fp8_e4m3`` the latent is stored scaled: ``kv_lora_rank`` fp8
  bytes, a 4-byte scale per 128 and the rope part in bf16 — 656 bytes a layer for
  ``kv_lora_rank`` 512 and rope 64 — unless a TRT-LLM DSA backend (or TileLang for
  both) reads the raw layout (``kv_cache_configurator.py:3412-3475``).
* Pages are ``64 × index_kpool`` tokens (a page owns a whole pooled index group;
  ``arg_groups/model_overrides/deepseek_v2.py:160-173``).
* ``kv_cache_dtype=auto`` is bfloat16 on Hopper (fp8 from SM100 on;
  ``arg_groups/overrides.py:490-547``): the planner assumes Hopper unless SGLang's own
  resolution says otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: Architectures SGLang 0.5.23 gives DeepSeek sparse attention's indexer when their
#: config has ``index_topk`` (``configs/model_config.py:191-212``, ``is_deepseek_dsa``).
DSA_ARCHS = frozenset(
    {
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLMNextN",
        "MistralLarge3ForCausalLM",
        "PixtralForConditionalGeneration",
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaForCausalLMNextN",
        "Glm5NextForConditionalGenerationNextN",
        "Glm5NextForConditionalGeneration",
        "LongcatFlashForCausalLM",
        "LongcatFlashForCausalLMNextN",
        "Dots3NoteForCausalLM",
        "Dots3NoteForCausalLMNextN",
        "HYV4ForCausalLM",
        "HYV4ForCausalLMNextN",
    }
)
#: ``DSATokenToKVPool.quant_block_size``: one 4-byte scale per this many values.
QUANT_BLOCK = 128
#: The KV dtype SGLang picks for ``auto`` on a DSA model on Hopper (SM90).
HOPPER_DSA_KV_DTYPE = "bfloat16"


@dataclass(frozen=True)
class DsaIndexer:
    """The DSA indexer of a model: its key width and which layers keep keys."""

    index_head_dim: int
    index_kpool: int
    #: Layers with their own top-k (the others reuse the previous layer's, keep none).
    indexer_layers: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any], layers: int) -> DsaIndexer | None:
        """The indexer of a config.json mapping (SGLang reads it from the top level,
        ``hf_config``); None for a model without one."""
        archs = config.get("architectures")
        arch = str(archs[0]) if isinstance(archs, list) and archs else ""
        head_dim = _int(config, "index_head_dim")
        if arch not in DSA_ARCHS or config.get("index_topk") is None or not head_dim:
            return None
        kpool = max(1, _int(config, "index_kpool") or 1)
        # Counted over the layers of a real config; a request's absurd count is bounded.
        own = sum(1 for i in range(min(layers, 4096)) if not skips_topk(config, i))
        return cls(index_head_dim=head_dim, index_kpool=kpool, indexer_layers=own)

    @property
    def page_size(self) -> int:
        """The page SGLang sets for a DSA model on CUDA."""
        return 64 * self.index_kpool

    def bytes_per_layer(self) -> int:
        """Index-key bytes one layer keeps per token."""
        width = self.index_head_dim + self.index_head_dim // QUANT_BLOCK * 4
        return math.ceil(width / self.index_kpool)


def skips_topk(config: Mapping[str, Any], layer: int) -> bool:
    """Whether DSA layer ``layer`` reuses the previous layer's top-k indices
    (``configs/model_config.py:488-521``, ``dsa_layer_skips_topk``)."""
    types = config.get("indexer_types")
    if isinstance(types, list):
        return 0 <= layer < len(types) and types[layer] == "shared"
    cli = _int(config, "cli_factor") or 1
    if cli > 1:
        return layer % cli != 0
    pattern = config.get("index_topk_pattern")
    if isinstance(pattern, (list, str)):
        return layer < len(pattern) and pattern[layer] == "S"
    freq = max(1, _int(config, "index_topk_freq") or 1)
    offset = _int(config, "index_skip_topk_offset")
    if offset is not None and offset > 0:
        return max(layer - offset + 1, 0) % freq != 0
    return max(layer - 1, 0) % freq != 0


def raw_layout(levers: Mapping[str, Any]) -> bool:
    """Whether the DSA backends read the raw MLA layout (TRT-LLM on either side, or
    TileLang on both), so an fp8 latent carries no scales."""
    prefill = str(levers.get("dsa_prefill_backend") or "")
    decode = str(levers.get("dsa_decode_backend") or "")
    return "trtllm" in (prefill, decode) or prefill == decode == "tilelang"


def latent_dim(kv_lora_rank: int, rope_dim: int, fp8: bool, levers: Mapping[str, Any]) -> int:
    """Elements of one layer's latent per token (``calculate_mla_kv_cache_dim``)."""
    if not fp8 or raw_layout(levers):
        return kv_lora_rank + rope_dim
    return kv_lora_rank + kv_lora_rank // QUANT_BLOCK * 4 + rope_dim * 2


def every_layer_keeps_keys(levers: Mapping[str, Any]) -> bool:
    """HiSparse and the external cache linker keep index keys for every layer."""
    return any(
        levers.get(name) is True or str(levers.get(name)).lower() == "true"
        for name in ("enable_hisparse", "enable_unified_cache_external_linker")
    )


def _int(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)
