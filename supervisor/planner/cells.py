"""Bytes per token ("cell") and per request state, as SGLang 0.5.23 sizes its pools.

(``model_executor/pool_configurator.py``; paths under ``sglang/srt/``.)

* MHA/GQA: ``max(1, kv_heads // attn_tp) × (head_dim + v_head_dim) × b`` per layer — KV
  heads split over the *attention* TP group (``tp / attn_dp_size``), replicated when
  fewer (``:491-497``, ``get_num_kv_heads(attn_tp_size)``).
* MLA: ``(kv_lora_rank + qk_rope_head_dim) × b`` per layer, never split (``:359-396``);
  DSA models add the indexer's key cache and store an fp8 latent with its scales
  (``planner.dsa``): DeepSeek-V3.2 78,324 B/token in bf16, 48,068 in fp8.
* Only full-attention layers hold KV in linear-attention hybrids (``:228-236``).
* Sliding-window hybrids: ``full × full_layers + swa_full_tokens_ratio × swa ×
  swa_layers`` (``:786-803``), a float: 8,294.4 B/token for gpt-oss-120b at TP8 bf16.
* EAGLE/NEXTN drafts add ``int(cell × draft_layers / layers)`` (``:258-317``).
* ``b`` = 2 for auto/bf16, 1 for fp8; ``auto`` on a checkpoint whose
  ``kv_cache_quant_algo`` is FP8 already stores fp8 (``mem_cache/kv_cache_dtype.py:49-57``).
* With PP a rank holds ``ceil(layers / pp)`` layers (the fullest stage sizes the pool).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sglang_supervisor.planner import dsa
from sglang_supervisor.planner.inputs import lever_float, speculative
from sglang_supervisor.planner.model import ModelShape
from sglang_supervisor.sglang.layout import Layout

#: SGLang's default ``swa_full_tokens_ratio``.
DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8


def kv_element_bits(kv_cache_dtype: str | None) -> int:
    """Bits per stored K or V element: 16 for auto/bf16, 8 for fp8 and mxfp8, 4 for the
    fp4 recipes (their per-block scale buffers are not counted)."""
    dtype = (kv_cache_dtype or "auto").lower()
    if dtype.startswith(("fp8", "mxfp8")):
        return 8
    if "fp4" in dtype:
        return 4
    return 16


def is_fp8(kv_cache_dtype: str | None) -> bool:
    return kv_element_bits(kv_cache_dtype) <= 8


def effective_kv_dtype(shape: ModelShape, kv_cache_dtype: str | None) -> str:
    """The KV dtype SGLang stores: ``auto`` is fp8_e4m3 on a checkpoint quantized with
    ``kv_cache_quant_algo: FP8``, else the lever (``auto``: the model's dtype)."""
    dtype = str(kv_cache_dtype or "auto")
    algo = (shape.kv_cache_quant_algo or "").upper()
    if dtype == "auto" and algo == "FP8":
        return "fp8_e4m3"
    if dtype == "auto" and shape.dsa is not None:
        return dsa.HOPPER_DSA_KV_DTYPE  # arg_groups/overrides.py:533-537 (SM90)
    return dtype


def draft_layers(shape: ModelShape, levers: Mapping[str, Any]) -> int:
    """Draft-model layers whose KV shares the target's pool with EAGLE/NEXTN: DeepSeek's
    MTP layers, else one (an EAGLE head)."""
    if not speculative(levers):
        return 0
    return shape.num_nextn_predict_layers or 1


@dataclass(frozen=True)
class Cells:
    """One rank's bytes per token (per pool) and per request state slot."""

    #: Bytes per token of one full-attention layer, and of one sliding-window layer.
    full_per_layer: int
    swa_per_layer: int
    full_layers: int
    swa_layers: int
    draft_bytes: int
    swa_full_tokens_ratio: float
    #: One request's linear-attention state on this rank (0 without such layers).
    mamba_state_bytes: int
    kv_cache_dtype: str
    #: The DSA indexer's key cache per token on this rank (0 without DSA).
    indexer_bytes: int = 0

    @property
    def full_bytes(self) -> int:
        """Bytes per token of the full pool (target + indexer keys + draft)."""
        return self.full_per_layer * self.full_layers + self.indexer_bytes + self.draft_bytes

    @property
    def swa_bytes(self) -> int:
        """Bytes per token of the sliding-window pool."""
        return self.swa_per_layer * self.swa_layers

    @property
    def exact(self) -> float:
        """Bytes per token of ``max_total_num_tokens``: full + ratio × SWA."""
        if self.swa_layers == 0:
            return float(self.full_bytes)
        return self.full_bytes + self.swa_full_tokens_ratio * self.swa_bytes

    @property
    def cell(self) -> int:
        return int(self.exact)


def cells(shape: ModelShape, levers: Mapping[str, Any]) -> Cells:
    """The cells of ``shape`` under ``levers`` (TP, attention DP, PP, KV dtype, draft)."""
    lay = Layout.of(levers)
    dtype = effective_kv_dtype(shape, str(levers.get("kv_cache_dtype") or "auto"))
    bits = kv_element_bits(dtype)
    pp = lay.pp_size
    stage = max(1, math.ceil(shape.num_layers / pp))
    scale = stage / shape.num_layers
    full_layers = max(0, math.ceil(shape.kv_layers * scale)) if pp > 1 else shape.kv_layers
    swa_layers = math.ceil(shape.swa_layers * scale) if pp > 1 else shape.swa_layers
    indexer = shape.dsa
    if shape.is_mla:
        lora, rope = shape.kv_lora_rank or 0, shape.qk_rope_head_dim or 0
        dim = lora + rope if indexer is None else dsa.latent_dim(lora, rope, bits <= 8, levers)
        per_layer = dim * bits // 8
    else:
        heads = max(1, shape.num_kv_heads // lay.attn_tp_size)
        per_layer = heads * 2 * shape.head_dim * bits // 8
    drafts = draft_layers(shape, levers)
    draft = 0
    index_bytes = 0
    if indexer is not None:
        keeping = shape.num_layers if dsa.every_layer_keeps_keys(levers) else indexer.indexer_layers
        keeping = math.ceil(keeping * scale) if pp > 1 else keeping
        index_bytes = indexer.bytes_per_layer() * keeping
    if drafts and indexer is not None:
        # pool_configurator.py:281-308: the draft's latent at the target's rate, plus
        # index keys for every draft layer.
        draft = per_layer * drafts + indexer.bytes_per_layer() * drafts
    elif drafts:
        if shape.is_hybrid_swa:
            draft = per_layer * drafts
        elif full_layers > 0:
            draft = int(per_layer * full_layers * drafts / full_layers)
    mamba = 0
    if shape.linear_attention is not None and shape.linear_layers:
        linear = math.ceil(shape.linear_layers * scale) if pp > 1 else shape.linear_layers
        mamba = shape.linear_attention.state_bytes_per_layer(lay.attn_tp_size) * linear
    ratio = lever_float(levers, "swa_full_tokens_ratio")
    return Cells(
        full_per_layer=per_layer,
        swa_per_layer=per_layer,
        full_layers=full_layers,
        swa_layers=swa_layers,
        draft_bytes=draft,
        swa_full_tokens_ratio=DEFAULT_SWA_FULL_TOKENS_RATIO if ratio is None else ratio,
        mamba_state_bytes=mamba,
        kv_cache_dtype=dtype,
        indexer_bytes=index_bytes,
    )


def cell_bytes(
    shape: ModelShape, tp_size: int, kv_cache_dtype: str | None, pp_size: int = 1
) -> int:
    """KV bytes one token takes on one rank (``Cells.cell``) for plain TP/PP levers."""
    levers = {"tp_size": tp_size, "pp_size": pp_size, "kv_cache_dtype": kv_cache_dtype}
    return cells(shape, levers).cell
