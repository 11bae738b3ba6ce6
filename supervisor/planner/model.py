"""A model as the planner sees it: its attention shape, its layers' kinds, its weights.

Read from a Hugging Face ``config.json`` (and, for a local directory, the safetensors
index and files). The layer kinds follow SGLang 0.5.23's model configs:

* sliding-window layers (gpt-oss): ``layer_types`` entries ``sliding_attention``
  (``srt/configs/model_config.py``, ``swa_attention_layer_ids``);
* linear-attention (GDN / Mamba-like) layers (Qwen3-Next): every layer but each
  ``full_attention_interval``-th one (``srt/configs/qwen3_next.py:259-285``); only the
  full-attention layers hold KV (``model_executor/pool_configurator.py:228-236``);
* DeepSeek's multi-token-prediction layers (``num_nextn_predict_layers``) are in the
  checkpoint but loaded only as the draft model of speculative decoding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sglang_supervisor.planner.dsa import DsaIndexer
from sglang_supervisor.planner.multimodal import Multimodal
from sglang_supervisor.units import GB as GB
from sglang_supervisor.units import GiB as GiB
from sglang_supervisor.units import MiB as MiB

if TYPE_CHECKING:
    from sglang_supervisor.planner.served import ServedSizing


class PlanError(ValueError):
    """The inputs cannot be planned for; the message says what and how to fix it."""


# --- the model ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LinearAttention:
    """A gated-delta-net (Qwen3-Next) layer's state shape, from ``config.json``."""

    conv_kernel: int
    key_head_dim: int
    value_head_dim: int
    num_key_heads: int
    num_value_heads: int
    #: Bytes per SSM state element (float32 unless ``mamba_ssm_dtype`` says otherwise).
    ssm_bytes: int = 4
    conv_bytes: int = 2

    def state_bytes_per_layer(self, attn_tp: int) -> int:
        """One request's conv + SSM state in one layer on one rank
        (``srt/configs/mamba_utils.py:196-240``, ``mamba_cache_per_req`` at ``:116-125``):
        conv ``(value_dim + 2 × key_heads × key_dim) / tp × (kernel − 1)``, SSM
        ``value_heads / tp × value_dim × key_dim``."""
        tp = max(1, attn_tp)
        groups = self.num_key_heads
        if groups % tp:
            groups += tp - groups % tp  # SGLang extends the groups to a multiple of tp
        conv_dim = self.value_head_dim * self.num_value_heads + 2 * groups * self.key_head_dim
        conv = conv_dim // tp * (self.conv_kernel - 1) * self.conv_bytes
        heads = max(1, self.num_value_heads // tp)
        ssm = heads * self.value_head_dim * self.key_head_dim * self.ssm_bytes
        return conv + ssm


@dataclass(frozen=True)
class ModelShape:
    """What the KV math needs from a ``config.json``."""

    architecture: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    #: MLA (multi-head latent attention) when set.
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    model_type: str = ""
    #: Layers with a full KV history (None: all of them).
    full_attention_layers: int | None = None
    #: Sliding-window layers (their pool holds ``swa_full_tokens_ratio`` × the full one).
    swa_layers: int = 0
    sliding_window: int | None = None
    #: Linear-attention (GDN) layers keep a fixed-size state per request instead of KV.
    linear_attention: LinearAttention | None = None
    linear_layers: int = 0
    #: The checkpoint's own KV quantization (``kv_cache_quant_algo``), e.g. "FP8".
    kv_cache_quant_algo: str | None = None
    #: Multi-token-prediction layers shipped with the checkpoint (DeepSeek's MTP).
    num_nextn_predict_layers: int = 0
    #: DeepSeek sparse attention's indexer (V3.2, GLM-5): its key cache per token.
    dsa: DsaIndexer | None = None
    #: A multimodal checkpoint (a vision tower...): SGLang's memory rule reads it.
    multimodal: Multimodal | None = None

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def kv_layers(self) -> int:
        """Layers whose KV grows with the sequence (full attention)."""
        if self.full_attention_layers is not None:
            return self.full_attention_layers
        return self.num_layers - self.swa_layers - self.linear_layers

    @property
    def is_hybrid_swa(self) -> bool:
        return self.swa_layers > 0

    @property
    def is_mamba_hybrid(self) -> bool:
        return self.linear_attention is not None and self.linear_layers > 0

    @property
    def attention(self) -> str:
        base = (
            "MLA"
            if self.is_mla
            else ("MHA" if self.num_kv_heads == self.num_attention_heads else "GQA")
        )
        if self.is_hybrid_swa:
            return f"{base} + sliding window"
        if self.is_mamba_hybrid:
            return f"{base} + linear attention"
        return base

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """Read a HF ``config.json`` mapping (a nested ``text_config`` is used when the
        top level has no layer count, as in multimodal checkpoints).

        Raises ``PlanError`` naming the missing or malformed key.
        """
        cfg = _text_config(config)
        layers = _cfg_int(cfg, "num_hidden_layers", "n_layer", "num_layers")
        heads = _cfg_int(cfg, "num_attention_heads", "n_head")
        hidden = _cfg_int(cfg, "hidden_size", "n_embd", "d_model")
        kv_heads = _cfg_int(cfg, "num_key_value_heads", "n_kv_heads", default=heads)
        head_dim = _cfg_int(cfg, "head_dim", default=0) or hidden // heads
        kv_lora = _cfg_opt_int(cfg, "kv_lora_rank")
        rope = _cfg_opt_int(cfg, "qk_rope_head_dim")
        if kv_lora is not None and rope is None:
            raise PlanError(
                "config.json has kv_lora_rank (an MLA model) but no qk_rope_head_dim; "
                "add it from the model card"
            )
        # SGLang dispatches on the checkpoint's own architecture, not its text config's.
        archs = config.get("architectures") or cfg.get("architectures") or []
        arch = str(archs[0]) if isinstance(archs, list) and archs else str(cfg.get("model_type"))
        if min(layers, heads, hidden, kv_heads, head_dim) <= 0:
            raise PlanError(
                f"config.json gives non-positive sizes (layers={layers}, heads={heads}, "
                f"kv_heads={kv_heads}, hidden_size={hidden}, head_dim={head_dim}); "
                "check the file"
            )
        swa, linear, full = _layer_kinds(cfg, layers, arch)
        lin = _linear_attention(cfg) if linear else None
        window = None
        if swa:
            # model_config.py:797-800,1961-1965: Llama-4's window is its attention chunk.
            window = _cfg_opt_int(cfg, "sliding_window") or _cfg_opt_int(
                cfg, "attention_chunk_size"
            )
        return cls(
            architecture=arch,
            num_layers=layers,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            hidden_size=hidden,
            kv_lora_rank=kv_lora,
            qk_rope_head_dim=rope,
            model_type=str(cfg.get("model_type") or ""),
            full_attention_layers=full,
            swa_layers=swa,
            sliding_window=window,
            linear_attention=lin,
            linear_layers=linear if lin is not None else 0,
            kv_cache_quant_algo=kv_quant_algo(config),
            num_nextn_predict_layers=_cfg_int(cfg, "num_nextn_predict_layers", default=0),
            dsa=DsaIndexer.from_config(config, layers) if kv_lora is not None else None,
            multimodal=Multimodal.from_config(config),
        )


#: Architectures SGLang 0.5.23 builds a hybrid sliding-window pool for
#: (``srt/configs/model_config.py:88-96`` ``SWA_SINK_ARCHS`` and ``:2651-2696``
#: ``is_hybrid_swa_model``); any other model's sliding layers (gemma-3's, Mistral's)
#: keep a full KV history in SGLang's pool.
HYBRID_SWA_ARCHS = frozenset(
    {
        "GptOssForCausalLM",
        "GraniteSWAForCausalLM",
        "GraniteMoeSWAForCausalLM",
        "IQuestQ1ForCausalLM",
        "BeamForCausalLM",
        "Llama4ForConditionalGeneration",
        "MiMoV2ForCausalLM",
        "MiMoV2FlashForCausalLM",
        "Step3p5ForCausalLM",
        "Step3p7ForConditionalGeneration",
        "Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration",
        "Gemma4UnifiedForConditionalGeneration",
        "LagunaForCausalLM",
        "MellumForCausalLM",
        "InklingForConditionalGeneration",
    }
)
#: Llama-4's chunked-attention layers: every layer but each 4th
#: (``srt/configs/model_config.py:2705-2711``).
LLAMA4 = "Llama4ForConditionalGeneration"


def _layer_kinds(
    cfg: Mapping[str, Any], layers: int, arch: str = ""
) -> tuple[int, int, int | None]:
    """(sliding-window layers, linear-attention layers, full-attention layers or None)."""
    if arch == LLAMA4:
        full = sum(1 for i in range(layers) if (i + 1) % 4 == 0)
        return layers - full, 0, full
    hybrid_swa = arch in HYBRID_SWA_ARCHS or cfg.get("is_hybrid_swa") is True
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == layers and all(isinstance(t, str) for t in types):
        swa = sum(1 for t in types if t in ("sliding_attention", "sliding_window"))
        swa = swa if hybrid_swa else 0
        linear = sum(1 for t in types if t in ("linear_attention", "mamba"))
        if swa or linear:
            return swa, linear, layers - swa - linear
    interval = _cfg_opt_int(cfg, "full_attention_interval")
    if interval and interval > 0 and "linear_num_value_heads" in cfg:
        # qwen3_next.py:259-268: layer l is full attention when (l + 1) % interval == 0.
        # Counted, not walked: num_hidden_layers comes from a request's config_json.
        full = layers // interval
        return 0, layers - full, full
    return 0, 0, None


def _linear_attention(cfg: Mapping[str, Any]) -> LinearAttention | None:
    try:
        ssm = str(cfg.get("mamba_ssm_dtype") or "float32")
        return LinearAttention(
            conv_kernel=_cfg_int(cfg, "linear_conv_kernel_dim"),
            key_head_dim=_cfg_int(cfg, "linear_key_head_dim"),
            value_head_dim=_cfg_int(cfg, "linear_value_head_dim"),
            num_key_heads=_cfg_int(cfg, "linear_num_key_heads"),
            num_value_heads=_cfg_int(cfg, "linear_num_value_heads"),
            ssm_bytes=4 if ssm == "float32" else 2,
        )
    except PlanError:
        return None


def kv_quant_algo(config: Mapping[str, Any]) -> str | None:
    """The checkpoint's ``kv_cache_quant_algo`` (``quantization_config`` in config.json,
    or the ``quantization`` section ModelOpt writes to ``hf_quant_config.json``, merged in
    by ``load_model_dir`` under the same key): SGLang stores KV in fp8 for "FP8" even with
    ``kv_cache_dtype=auto`` (``srt/mem_cache/kv_cache_dtype.py:49-57``)."""
    for section in (config.get("quantization_config"), config.get("_hf_quant_config")):
        if isinstance(section, Mapping):
            inner = section.get("quantization")
            for where in (section, inner if isinstance(inner, Mapping) else {}):
                algo = where.get("kv_cache_quant_algo")
                if isinstance(algo, str) and algo:
                    return algo
    return None


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    text = config.get("text_config")
    if isinstance(text, Mapping) and "num_hidden_layers" not in config:
        return text
    return config


def _cfg_opt_int(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlanError(f"config.json key {key!r} must be a number, got {value!r}")
    return int(value)


def _cfg_int(cfg: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = _cfg_opt_int(cfg, key)
        if value is not None:
            return value
    if default is not None:
        return default
    raise PlanError(
        f"config.json has no {' / '.join(keys)}: is it a transformer model's config.json?"
    )


@dataclass(frozen=True)
class ModelSpec:
    """A model as the planner sees it: its shape and its weight bytes (all ranks together)."""

    name: str
    #: Where the config came from ("config.json in /models/x", "inline config", ...).
    source: str
    shape: ModelShape
    weight_bytes: int
    #: How ``weight_bytes`` was found: index metadata, file sizes, or an estimate.
    weight_source: str
    context_length: int | None = None
    #: Bytes of ``weight_bytes`` in multi-token-prediction layers: loaded only as the
    #: draft of speculative decoding.
    mtp_weight_bytes: int = 0
    #: Bytes of the attention projections (replicated over attention-DP groups).
    attention_weight_bytes: int = 0
    #: The running server's own sizing of this model (``planner.served``), when the plan
    #: is for the server that serves it.
    served: ServedSizing | None = None

    @property
    def architecture(self) -> str:
        return self.shape.architecture

    def loaded_weight_bytes(self, speculative: bool) -> int:
        """The weights SGLang loads: without speculative decoding, not the MTP layers."""
        return self.weight_bytes if speculative else self.weight_bytes - self.mtp_weight_bytes

    def to_json(self) -> dict[str, Any]:
        s = self.shape
        return {
            "name": self.name,
            "source": self.source,
            "architecture": s.architecture,
            "attention": s.attention,
            "num_layers": s.num_layers,
            "num_attention_heads": s.num_attention_heads,
            "num_kv_heads": s.num_kv_heads,
            "head_dim": s.head_dim,
            "kv_lora_rank": s.kv_lora_rank,
            "qk_rope_head_dim": s.qk_rope_head_dim,
            "kv_layers": s.kv_layers,
            "sliding_window_layers": s.swa_layers,
            "linear_attention_layers": s.linear_layers,
            "kv_cache_quant_algo": s.kv_cache_quant_algo,
            "num_nextn_predict_layers": s.num_nextn_predict_layers,
            "weight_bytes": self.weight_bytes,
            "mtp_weight_bytes": self.mtp_weight_bytes,
            "weight_source": self.weight_source,
            "context_length": self.context_length,
            "served": None if self.served is None else self.served.to_json(),
        }
