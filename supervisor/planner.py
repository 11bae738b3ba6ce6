"""KV-cache capacity math and lever recommendations for SGLang 0.5.23.

Pure functions and dataclasses; the only I/O is reading a model directory (``config.json``,
``model.safetensors.index.json``, ``*.safetensors`` sizes). The simulated server sizes its
KV pool with these same functions, so a plan and the simulation agree exactly.

The facts (SGLang 0.5.23, ``sglang/srt/arg_groups/memory_hook.py`` and
``model_executor/pool_configurator.py``):

* Bytes per token per rank ("cell"): MHA/GQA ``2 × layers × max(1, kv_heads // tp) ×
  head_dim × b`` (K and V; KV heads split by TP and replicated when fewer than TP;
  ``head_dim`` from the config when present, else ``hidden_size // num_attention_heads``);
  MLA (``kv_lora_rank`` in the config: DeepSeek-V3, Kimi-K2) ``(kv_lora_rank +
  qk_rope_head_dim) × layers × b``, not divided by TP. ``b`` = 2 for auto/bf16, 1 for any
  fp8 KV dtype. With pipeline parallelism a rank holds ``ceil(layers / pp)`` layers.
* Device KV tokens: ``(mem_fraction_static × total − weights_per_rank) / cell``. The
  fraction is of the GPU's *total* memory and the weights come out of it. Real SGLang also
  subtracts what the CUDA context and NCCL take before the pool is sized (about 1–3 GiB per
  GPU), so its logged ``#tokens`` is a few percent lower than this estimate.
* The safe fraction is SGLang's own default rule: ``(total − reserved) / total`` where
  ``reserved`` (MiB) = 512 + activation tokens × 1.5 + tp × pp / 8 × 1024 + the CUDA-graph
  reserve (decode max batch × 2, plus the prefill graphs), at least 10 GiB on GPUs over
  60 GiB.
* Host pool (hierarchical cache) tokens per rank: ``hicache_size × 1e9 // cell`` (decimal
  GB per rank), else ``hicache_ratio × device tokens`` (ratio 2.0 by default). It raises
  prefix reuse (the cache hit rate), not the number of requests decoding at once.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from supervisor.layout import Layout
from supervisor.preflight import SGLANG_HOST_RAM_MARGIN, host_pool_bytes_per_rank
from supervisor.units import GB, GiB

MiB = 1 << 20

#: Host RAM the planner leaves to the OS, page cache, the tokenizer and detokenizer and the
#: daemon, on top of SGLang's margin: 10% of what is available, at least 8 GiB.
OS_HEADROOM_FRACTION = 0.10
OS_HEADROOM_MIN_BYTES = 8 * GiB
#: SGLang's hicache_ratio when the hierarchical cache is on and no size is given.
DEFAULT_HICACHE_RATIO = 2.0
#: The average request length assumed when neither the caller nor the live server says.
DEFAULT_AVG_TOKENS = 4096
#: The fp8 KV dtype the planner proposes (e4m3: more mantissa, the usual choice).
PROPOSED_FP8_DTYPE = "fp8_e4m3"
#: Largest decode CUDA-graph batch the planner proposes (each captured size costs
#: ~2 MiB of reserve; SGLang's own largest default is 512).
MAX_PROPOSED_GRAPH_BS = 1024
#: SGLang's floor on activation tokens, and the smallest chunk the planner proposes.
MIN_ACTIVATION_TOKENS = 2048
#: SGLang's reserve floor on GPUs over 60 GiB.
RESERVE_FLOOR_MIB = 10 * 1024
LARGE_GPU_MIB = 60 * 1024

_BYTES_PER_DTYPE = {
    "float32": 2,  # SGLang serves fp32 checkpoints in fp16 ("auto")
    "float": 2,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
}


class PlanError(ValueError):
    """The inputs cannot be planned for; the message says what and how to fix it."""


# --- the model ---------------------------------------------------------------------------


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

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def attention(self) -> str:
        if self.is_mla:
            return "MLA"
        return "MHA" if self.num_kv_heads == self.num_attention_heads else "GQA"

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
        archs = cfg.get("architectures") or config.get("architectures") or []
        arch = str(archs[0]) if isinstance(archs, list) and archs else str(cfg.get("model_type"))
        if min(layers, heads, hidden, kv_heads, head_dim) <= 0:
            raise PlanError(
                f"config.json gives non-positive sizes (layers={layers}, heads={heads}, "
                f"kv_heads={kv_heads}, hidden_size={hidden}, head_dim={head_dim}); "
                "check the file"
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
        )


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

    @property
    def architecture(self) -> str:
        return self.shape.architecture

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
            "weight_bytes": self.weight_bytes,
            "weight_source": self.weight_source,
            "context_length": self.context_length,
        }


def _linear_bytes_per_param(config: Mapping[str, Any]) -> tuple[float, str]:
    """Bytes per weight of the linear layers, and the precision in words."""
    quant = config.get("quantization_config")
    if isinstance(quant, Mapping):
        method = str(quant.get("quant_method") or quant.get("quant_algo") or "").lower()
        bits = quant.get("bits") or quant.get("w_bit")
        if isinstance(bits, int) and not isinstance(bits, bool) and bits > 0:
            return bits / 8, f"{bits}-bit ({method or 'quantized'})"
        if "fp4" in method:
            return 0.5, method
        if "fp8" in method or "int8" in method or method == "w8a8":
            return 1.0, method
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return float(_BYTES_PER_DTYPE.get(dtype, 2)), dtype


def estimate_params(config: Mapping[str, Any]) -> tuple[int, int]:
    """(linear-layer parameters, embedding parameters) estimated from ``config.json``.

    Counts the attention projections (MHA/GQA, or MLA's low-rank ones), the MLP (dense,
    or MoE: routed + shared experts + router; DeepSeek's ``first_k_dense_replace`` and
    Qwen's ``mlp_only_layers`` are dense) and the embeddings (doubled unless tied). Norms,
    biases and multi-token-prediction layers are left out (< 1%).
    """
    cfg = _text_config(config)
    shape = ModelShape.from_config(config)
    h, layers, heads = shape.hidden_size, shape.num_layers, shape.num_attention_heads
    vocab = _cfg_int(cfg, "vocab_size", default=32000)
    tied = bool(cfg.get("tie_word_embeddings", False))
    embed = vocab * h * (1 if tied else 2)
    if shape.is_mla:
        rope = shape.qk_rope_head_dim or 0
        nope = _cfg_int(cfg, "qk_nope_head_dim", default=128)
        v_dim = _cfg_int(cfg, "v_head_dim", default=nope)
        q_lora = _cfg_opt_int(cfg, "q_lora_rank")
        qk = heads * (nope + rope)
        q = h * qk if not q_lora else h * q_lora + q_lora * qk
        kv = h * ((shape.kv_lora_rank or 0) + rope) + (shape.kv_lora_rank or 0) * heads * (
            nope + v_dim
        )
        attn = q + kv + heads * v_dim * h
    else:
        d = shape.head_dim
        attn = 2 * h * heads * d + 2 * h * shape.num_kv_heads * d
    inter = _cfg_int(cfg, "intermediate_size", "ffn_hidden_size", default=4 * h)
    experts = _cfg_int(cfg, "n_routed_experts", "num_experts", "num_local_experts", default=0)
    if experts > 0:
        moe_inter = _cfg_int(cfg, "moe_intermediate_size", default=inter)
        shared = _cfg_int(cfg, "n_shared_experts", default=0) * 3 * h * moe_inter
        shared += 3 * h * _cfg_int(cfg, "shared_expert_intermediate_size", default=0)
        moe_layer = experts * 3 * h * moe_inter + shared + h * experts
        only_dense = cfg.get("mlp_only_layers")
        dense = _cfg_int(cfg, "first_k_dense_replace", default=0) + (
            len(only_dense) if isinstance(only_dense, list) else 0
        )
        dense = min(dense, layers)
        mlp = dense * 3 * h * inter + (layers - dense) * moe_layer
    else:
        mlp = layers * 3 * h * inter
    return layers * attn + mlp, embed


def estimate_weight_bytes(config: Mapping[str, Any]) -> tuple[int, str]:
    """Weight bytes estimated from ``config.json`` and a sentence saying how."""
    linear, embed = estimate_params(config)
    per_param, precision = _linear_bytes_per_param(_text_config(config))
    total = int(linear * per_param + embed * 2)
    return total, (
        f"estimated from config.json: {(linear + embed) / 1e9:.1f}e9 parameters, "
        f"{precision} ({per_param:g} B each), ±10%"
    )


def weight_bytes_from_dir(path: Path) -> tuple[int, str] | None:
    """Weight bytes of a local checkpoint: the index's ``metadata.total_size``, else the
    sum of its ``*.safetensors`` file sizes (headers included, < 0.1%); None when neither."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            data = json.loads(index.read_text())
            total = int(data["metadata"]["total_size"])
        except (OSError, ValueError, KeyError, TypeError):
            total = 0
        if total > 0:
            return total, f"{index.name} metadata.total_size"
    files = sorted(path.glob("*.safetensors"))
    if files:
        total = sum(f.stat().st_size for f in files)
        return total, f"the sizes of {len(files)} *.safetensors files"
    return None


def model_from_config(
    config: Mapping[str, Any],
    *,
    name: str,
    source: str,
    weight_bytes: int | None = None,
    weight_source: str | None = None,
) -> ModelSpec:
    """A ``ModelSpec`` from a config mapping; weights estimated unless given."""
    shape = ModelShape.from_config(config)
    if weight_bytes is None:
        weight_bytes, weight_source = estimate_weight_bytes(config)
    cfg = _text_config(config)
    ctx = _cfg_opt_int(cfg, "max_position_embeddings")
    return ModelSpec(
        name=name,
        source=source,
        shape=shape,
        weight_bytes=int(weight_bytes),
        weight_source=weight_source or "given",
        context_length=ctx,
    )


def read_config(path: Path) -> dict[str, Any]:
    """A ``config.json`` as a dict; ``PlanError`` saying what is wrong with the file."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise PlanError(f"{path} does not exist: give a model directory with config.json") from exc
    except OSError as exc:
        raise PlanError(f"cannot read {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise PlanError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise PlanError(f"{path} must hold a JSON object (a HF config.json)")
    return data


def load_model_dir(path: Path) -> ModelSpec:
    """A local model directory: its ``config.json`` and its weight bytes."""
    if not (path / "config.json").is_file():
        raise PlanError(
            f"{path} has no config.json: give a local model directory (a Hugging Face repo "
            "id cannot be read offline; download it or pass --config-json)"
        )
    config = read_config(path / "config.json")
    found = weight_bytes_from_dir(path)
    weights, how = found if found is not None else (None, None)
    return model_from_config(
        config,
        name=path.name,
        source=f"config.json in {path}",
        weight_bytes=weights,
        weight_source=how,
    )


# --- per-token and per-rank math ---------------------------------------------------------


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


def cell_bytes(
    shape: ModelShape, tp_size: int, kv_cache_dtype: str | None, pp_size: int = 1
) -> int:
    """KV bytes one token takes on one rank.

    MHA/GQA: ``2 × layers × max(1, kv_heads // tp) × head_dim × b``; MLA: ``(kv_lora_rank
    + qk_rope_head_dim) × layers × b`` (the latent is replicated, not split by TP). With
    ``pp_size`` > 1 a rank holds ``ceil(layers / pp)`` layers (the fullest stage sizes the
    pool).
    """
    layers = max(1, math.ceil(shape.num_layers / max(1, pp_size)))
    bits = kv_element_bits(kv_cache_dtype)
    if shape.is_mla:
        width = (shape.kv_lora_rank or 0) + (shape.qk_rope_head_dim or 0)
        return width * layers * bits // 8
    heads = max(1, shape.num_kv_heads // max(1, tp_size))
    return 2 * layers * heads * shape.head_dim * bits // 8


def weight_bytes_per_rank(model: ModelSpec, tp_size: int, pp_size: int = 1) -> int:
    """The weights split evenly over ``tp × pp`` ranks (replicated embeddings and norms
    are ignored: a slight underestimate at large TP)."""
    return int(model.weight_bytes // (max(1, tp_size) * max(1, pp_size)))


def kv_tokens(
    total_bytes: int, mem_fraction: float, weight_bytes_per_rank: int, cell_bytes: int
) -> int:
    """Tokens one rank's KV pool holds: ``(mem_fraction × total − weights) // cell``,
    floored at 0 (the weights alone do not fit)."""
    if cell_bytes <= 0:
        raise ValueError(f"cell_bytes must be positive, got {cell_bytes}")
    free_for_kv = mem_fraction * total_bytes - weight_bytes_per_rank
    return max(0, int(free_for_kv // cell_bytes))


def host_pool_tokens(
    hicache_size_gb: int, hicache_ratio: float | None, device_tokens: int, cell: int
) -> int:
    """Tokens one rank's host pool holds: ``hicache_size × 1e9 // cell`` when a size is
    given (it overrides the ratio), else ``ratio × device tokens`` (ratio 2.0 by default)."""
    if hicache_size_gb > 0:
        return int(hicache_size_gb * GB // cell)
    return int(device_tokens * (hicache_ratio or DEFAULT_HICACHE_RATIO))


def parse_count(text: object) -> int | None:
    """SGLang's human-readable integers: ``4096``, ``128k`` (×1000), ``1Mi`` (×2^20)."""
    if text is None or isinstance(text, bool):
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kMGT]i?)?\s*", str(text))
    if m is None:
        return None
    number, suffix = float(m.group(1)), m.group(2) or ""
    powers = {"k": 1, "M": 2, "G": 3, "T": 4}
    if suffix.endswith("i"):
        return int(number * 1024 ** powers[suffix[0]])
    return int(number * 1000 ** powers[suffix] if suffix else number)


# --- reading a lever set -----------------------------------------------------------------


def lever_int(levers: Mapping[str, Any], name: str) -> int | None:
    value = levers.get(name)
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def lever_float(levers: Mapping[str, Any], name: str) -> float | None:
    value = levers.get(name)
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def lever_bool(levers: Mapping[str, Any], name: str) -> bool:
    value = levers.get(name)
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def parallel_sizes(levers: Mapping[str, Any]) -> tuple[int, int, int]:
    """(tp, pp, dp replicas), each at least 1, as ``supervisor.layout`` resolves them."""
    shape = Layout.of(levers)
    return shape.tp_size, shape.pp_size, shape.dp_size


# --- SGLang's default memory fraction ----------------------------------------------------


def sglang_default_chunked_prefill(gpu_mib: float) -> int:
    """SGLang 0.5.23's ``chunked_prefill_size`` default by GPU memory (MiB)."""
    if gpu_mib < 20 * 1024:
        return 2048
    if gpu_mib < 60 * 1024:
        return 4096
    if gpu_mib < 160 * 1024:
        return 8192
    return 16384


def sglang_default_decode_max_bs(gpu_mib: float, tp_size: int) -> int:
    """SGLang 0.5.23's decode CUDA-graph max batch size by GPU memory (MiB) and TP."""
    if gpu_mib < 20 * 1024:
        return 8
    if gpu_mib < 35 * 1024:
        return 48 if tp_size < 4 else 160
    if gpu_mib < 60 * 1024:
        return 32 if tp_size < 4 else 160
    if gpu_mib < 160 * 1024:
        return 256 if tp_size < 4 else 512
    return 512


def prefill_graph_sizes(max_bs: int) -> list[int]:
    """The token counts SGLang captures prefill graphs for, up to ``max_bs``."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_bs + 1, 512))
    )
    return [s for s in sizes if s <= max_bs]


def decode_graph_sizes(max_bs: int) -> list[int]:
    """The batch sizes SGLang captures decode graphs for, up to ``max_bs``."""
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    out = [s for s in sizes if s <= max_bs]
    if max_bs not in out:
        out.append(max_bs)
    return out


def round_up_graph_bs(n: int) -> int:
    """The smallest default capture size ≥ ``n`` (so the whole batch replays a graph)."""
    for size in decode_graph_sizes(max(n, 1024 + 32)):
        if size >= n:
            return size
    return n


@dataclass(frozen=True)
class Reserve:
    """SGLang's memory reserve (MiB) outside ``mem_fraction_static`` for one lever set."""

    gpu_mib: float
    chunked_prefill_size: int
    activation_tokens: int
    decode_graph_max_bs: int | None
    parts_mib: dict[str, float]
    floor_mib: float
    total_mib: float

    @property
    def fraction(self) -> float:
        """``(total − reserved) / total``, unrounded."""
        return (self.gpu_mib - self.total_mib) / self.gpu_mib

    @property
    def sglang_default_fraction(self) -> float:
        """What SGLang itself picks when ``mem_fraction_static`` is unset (rounded to 3)."""
        return round(self.fraction, 3)

    @property
    def safe_fraction(self) -> float:
        """The highest fraction within the reserve, floored to 3 decimals."""
        return math.floor(self.fraction * 1000) / 1000

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {
            "safe_fraction": self.safe_fraction,
            "sglang_default_fraction": self.sglang_default_fraction,
        }


def sglang_reserve(gpu_bytes: int, levers: Mapping[str, Any], is_mla: bool) -> Reserve:
    """SGLang 0.5.23's reserved memory (``handle_gpu_memory_settings``) for ``levers``.

    reserved (MiB) = 512 (attention metadata) + max(chunked_prefill_size, 2048) × 1.5
    (activations; ``max_prefill_tokens`` when chunking is off) + tp × pp / 8 × 1024 +
    decode graph max batch × 2 + prefill graphs (8 MiB per captured size; 1536 MiB flat
    for MLA), at least 10 GiB on GPUs over 60 GiB. Assumed, as SGLang's defaults on CUDA:
    decode graphs "full", prefill graphs "breakable", no PD disaggregation, no DP attention
    or DeepEP buffers, no speculative decoding, not a VLM, post-capture KV sizing off.
    """
    gpu_mib = gpu_bytes / MiB
    tp, pp, _ = parallel_sizes(levers)
    chunk = lever_int(levers, "chunked_prefill_size")
    if chunk is None:
        chunk = sglang_default_chunked_prefill(gpu_mib)
    if chunk > 0:
        activation = max(chunk, MIN_ACTIVATION_TOKENS)
    else:
        activation = max(
            parse_count(levers.get("max_prefill_tokens")) or 16384, MIN_ACTIVATION_TOKENS
        )
    all_off = lever_bool(levers, "disable_cuda_graph")
    decode_on = not (
        all_off
        or lever_bool(levers, "disable_decode_cuda_graph")
        or str(levers.get("cuda_graph_backend_decode")) == "disabled"
    )
    prefill_on = not (
        all_off
        or lever_bool(levers, "disable_prefill_cuda_graph")
        or str(levers.get("cuda_graph_backend_prefill")) == "disabled"
    )
    max_bs = decode_max_bs(gpu_bytes, levers)
    parts: dict[str, float] = {
        "metadata": 512.0,
        "activations": activation * 1.5,
        "parallel": tp * pp / 8 * 1024,
        "decode_graphs": float(max_bs * 2) if decode_on else 0.0,
        "prefill_graphs": 0.0,
    }
    if prefill_on:
        if is_mla:
            parts["prefill_graphs"] = 1536.0
        else:
            prefill_bs = lever_int(levers, "cuda_graph_max_bs_prefill") or chunk
            parts["prefill_graphs"] = len(prefill_graph_sizes(prefill_bs)) * 8.0
    raw = sum(parts.values())
    floor = RESERVE_FLOOR_MIB if gpu_mib > LARGE_GPU_MIB else 0.0
    return Reserve(
        gpu_mib=gpu_mib,
        chunked_prefill_size=chunk,
        activation_tokens=activation,
        decode_graph_max_bs=max_bs if decode_on else None,
        parts_mib=parts,
        floor_mib=floor,
        total_mib=max(raw, floor),
    )


def decode_max_bs(gpu_bytes: int, levers: Mapping[str, Any]) -> int:
    """The decode CUDA-graph max batch: the lever, else SGLang's default (capped at
    ``max_running_requests`` when that is set, as SGLang does)."""
    explicit = lever_int(levers, "cuda_graph_max_bs_decode")
    if explicit is not None and explicit > 0:
        return explicit
    tp, _, _ = parallel_sizes(levers)
    default = sglang_default_decode_max_bs(gpu_bytes / MiB, tp)
    running = lever_int(levers, "max_running_requests")
    return min(default, running) if running and running > 0 else default


def sglang_default_fraction(gpu_bytes: int, levers: Mapping[str, Any], is_mla: bool) -> float:
    """``mem_fraction_static`` as SGLang 0.5.23 picks it when the lever is unset."""
    return sglang_reserve(gpu_bytes, levers, is_mla).sglang_default_fraction


def effective_fraction(gpu_bytes: int, levers: Mapping[str, Any], is_mla: bool) -> float:
    """The lever's value, else SGLang's default for this lever set."""
    value = lever_float(levers, "mem_fraction_static")
    return value if value is not None else sglang_default_fraction(gpu_bytes, levers, is_mla)


def pool_tokens(model: ModelSpec, levers: Mapping[str, Any], gpu_bytes: int) -> int:
    """``max_total_num_tokens`` of one replica for ``levers``: the KV math, capped by
    ``max_total_tokens`` when set. The simulated server reports exactly this."""
    tp, pp, _ = parallel_sizes(levers)
    cell = cell_bytes(model.shape, tp, str(levers.get("kv_cache_dtype") or "auto"), pp)
    fraction = effective_fraction(gpu_bytes, levers, model.shape.is_mla)
    tokens = kv_tokens(gpu_bytes, fraction, weight_bytes_per_rank(model, tp, pp), cell)
    cap = parse_count(levers.get("max_total_tokens"))
    return min(tokens, cap) if cap is not None else tokens


# --- the capacity of one lever set -------------------------------------------------------


@dataclass(frozen=True)
class Hardware:
    gpus: int
    gpu_memory_bytes: int
    #: Host RAM available to a new server (what SGLang's check measures).
    host_ram_available_bytes: int
    gpu_source: str = "given"
    host_ram_source: str = "given"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Capacity:
    """What one lever set gives, per rank and per replica."""

    mem_fraction_static: float
    #: "lever" or "SGLang default".
    mem_fraction_source: str
    safe_mem_fraction: float
    kv_cache_dtype: str
    cell_bytes: int
    weight_bytes_per_rank: int
    kv_tokens_per_rank: int
    kv_bytes_per_rank: int
    avg_tokens: int
    #: Requests whose KV fits at once at the average length, over all DP replicas.
    concurrent_requests: int
    hierarchical_cache: bool
    host_pool_tokens_per_rank: int
    host_ram_needed_bytes: int
    max_running_requests: int | None
    cuda_graph_max_bs_decode: int | None
    chunked_prefill_size: int
    ranks: int
    replicas: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def capacity(
    model: ModelSpec, levers: Mapping[str, Any], gpu_bytes: int, avg_tokens: int
) -> Capacity:
    """Device and host KV capacity of ``levers`` on GPUs of ``gpu_bytes`` each."""
    tp, pp, dp = parallel_sizes(levers)
    is_mla = model.shape.is_mla
    dtype = str(levers.get("kv_cache_dtype") or "auto")
    cell = cell_bytes(model.shape, tp, dtype, pp)
    reserve = sglang_reserve(gpu_bytes, levers, is_mla)
    explicit = lever_float(levers, "mem_fraction_static")
    tokens = pool_tokens(model, levers, gpu_bytes)
    hicache = lever_bool(levers, "enable_hierarchical_cache")
    host_tokens = 0
    if hicache:
        host_tokens = host_pool_tokens(
            lever_int(levers, "hicache_size") or 0,
            lever_float(levers, "hicache_ratio"),
            tokens,
            cell,
        )
    ranks = Layout.of(levers).ranks
    return Capacity(
        mem_fraction_static=explicit if explicit is not None else reserve.sglang_default_fraction,
        mem_fraction_source="lever" if explicit is not None else "SGLang default",
        safe_mem_fraction=reserve.safe_fraction,
        kv_cache_dtype=dtype,
        cell_bytes=cell,
        weight_bytes_per_rank=weight_bytes_per_rank(model, tp, pp),
        kv_tokens_per_rank=tokens,
        kv_bytes_per_rank=tokens * cell,
        avg_tokens=avg_tokens,
        concurrent_requests=dp * (tokens // max(1, avg_tokens)),
        hierarchical_cache=hicache,
        host_pool_tokens_per_rank=host_tokens,
        host_ram_needed_bytes=host_tokens * cell * ranks,
        max_running_requests=lever_int(levers, "max_running_requests"),
        cuda_graph_max_bs_decode=reserve.decode_graph_max_bs,
        chunked_prefill_size=reserve.chunked_prefill_size,
        ranks=ranks,
        replicas=dp,
    )


# --- live load ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveLoad:
    """What the running server says about its load (SGLang's gauges)."""

    running_requests: float | None = None
    queued_requests: float | None = None
    token_usage: float | None = None
    gen_tokens_per_s: float | None = None
    cache_hit_rate: float | None = None
    max_total_num_tokens: int | None = None

    def avg_tokens(self) -> int | None:
        """KV tokens per running request: ``token_usage × max_total_num_tokens / running``."""
        if not self.running_requests or self.token_usage is None or not self.max_total_num_tokens:
            return None
        value = round(self.token_usage * self.max_total_num_tokens / self.running_requests)
        return value if value > 0 else None

    def diagnosis(self) -> str:
        """Where the bottleneck is, in one sentence."""
        running = int(self.running_requests or 0)
        queued = int(self.queued_requests or 0)
        usage = self.token_usage
        if usage is None and self.running_requests is None:
            return "no live metrics yet: the plan rests on the model and the hardware alone"
        use = f"{usage:.2f}" if usage is not None else "unknown"
        if queued > 0 and usage is not None and usage >= 0.9:
            return (
                f"KV-cache bound: token usage {use} with {running} requests running and "
                f"{queued} queued — more KV tokens per GPU let more requests run at once"
            )
        if queued > 0:
            return (
                f"requests queue ({queued}) while the KV cache is {use} used with {running} "
                "running: the limit is max_running_requests or compute, not KV memory"
            )
        return (
            f"not saturated: {running} running, none queued, token usage {use} — the levers "
            "add headroom for load to come"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# --- the proposal ------------------------------------------------------------------------


@dataclass(frozen=True)
class LeverNote:
    lever: str
    #: The value in effect now (SGLang's default when the lever is unset).
    current: Any
    proposed: Any
    reason: str
    #: True when the lever is unset now and ``current`` is SGLang's default.
    current_is_default: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    hardware: Hardware
    avg_tokens: int
    avg_tokens_source: str
    target_concurrency: int | None
    diagnosis: str
    current_levers: dict[str, Any]
    current: Capacity
    proposed: Capacity
    #: The changes to submit (merged onto the current levers), each passing check_levers.
    levers: dict[str, Any]
    lever_notes: list[LeverNote]
    notes: list[str]
    live: LiveLoad | None = None
    reserve: dict[str, Any] = field(default_factory=dict)

    @property
    def proposed_levers(self) -> dict[str, Any]:
        return {**self.current_levers, **self.levers}

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model.to_json(),
            "hardware": self.hardware.to_json(),
            "workload": {
                "avg_tokens": self.avg_tokens,
                "avg_tokens_source": self.avg_tokens_source,
                "target_concurrency": self.target_concurrency,
                "live": None if self.live is None else self.live.to_json(),
            },
            "diagnosis": self.diagnosis,
            "current_levers": dict(self.current_levers),
            "current": self.current.to_json(),
            "proposed": self.proposed.to_json(),
            "levers": dict(self.levers),
            "lever_notes": [n.to_json() for n in self.lever_notes],
            "notes": list(self.notes),
            "predicted": {
                "kv_tokens_per_rank_delta": self.proposed.kv_tokens_per_rank
                - self.current.kv_tokens_per_rank,
                "max_total_num_tokens": self.proposed.kv_tokens_per_rank,
                "concurrent_requests_delta": self.proposed.concurrent_requests
                - self.current.concurrent_requests,
            },
            "reserve": dict(self.reserve),
        }


#: The order the proposal lists its levers in (the biggest effect on capacity first).
_LEVER_ORDER = {
    name: i
    for i, name in enumerate(
        (
            "kv_cache_dtype",
            "mem_fraction_static",
            "chunked_prefill_size",
            "max_running_requests",
            "cuda_graph_max_bs_decode",
            "enable_hierarchical_cache",
            "hicache_size",
        )
    )
}


def host_cache_budget_per_rank(host_ram_available_bytes: int, ranks: int) -> int:
    """Bytes of pinned host pool one rank may take: (available − SGLang's 10 GiB margin −
    OS headroom) / ranks, never negative. The total always fits SGLang's own check."""
    headroom = max(OS_HEADROOM_MIN_BYTES, int(host_ram_available_bytes * OS_HEADROOM_FRACTION))
    budget = host_ram_available_bytes - SGLANG_HOST_RAM_MARGIN - headroom
    return max(0, budget // max(1, ranks))


def _chunk_under_floor(gpu_bytes: int, levers: Mapping[str, Any], is_mla: bool, start: int) -> int:
    """The largest of ``start``, ``start / 2``, ... (≥ 2048) whose reserve stays within
    SGLang's 10 GiB floor; ``start`` when none does, or on GPUs ≤ 60 GiB (no floor)."""
    if gpu_bytes / MiB <= LARGE_GPU_MIB:
        return start
    chunk = start
    while chunk >= MIN_ACTIVATION_TOKENS:
        reserve = sglang_reserve(gpu_bytes, {**levers, "chunked_prefill_size": chunk}, is_mla)
        if reserve.total_mib <= reserve.floor_mib:
            return chunk
        chunk //= 2
    return start


def propose(
    model: ModelSpec,
    hardware: Hardware,
    current_levers: Mapping[str, Any],
    *,
    avg_tokens: int,
    avg_tokens_source: str = "given",
    target_concurrency: int | None = None,
    live: LiveLoad | None = None,
) -> Plan:
    """Every lever that raises KV capacity, sized for this model and machine.

    In order: fp8 KV (halves the cell); a chunked-prefill size that keeps SGLang's reserve
    at its 10 GiB floor; the highest safe ``mem_fraction_static`` for the result; the
    hierarchical cache sized to the host RAM left after SGLang's margin and OS headroom;
    ``max_running_requests`` = requests that fit at ``avg_tokens`` (or the target, when
    lower) and ``cuda_graph_max_bs_decode`` covering it. TP/PP/DP are never changed.

    Raises ``PlanError`` when the lever set needs more GPUs than ``hardware`` has or the
    inputs are out of range.
    """
    if avg_tokens <= 0:
        raise PlanError(f"avg_tokens must be positive, got {avg_tokens}")
    if hardware.gpu_memory_bytes <= 0 or hardware.gpus <= 0:
        raise PlanError("the GPU count and GPU memory must be positive")
    if target_concurrency is not None and target_concurrency <= 0:
        raise PlanError(f"target_concurrency must be positive, got {target_concurrency}")
    current = dict(current_levers)
    tp, pp, dp = parallel_sizes(current)
    shape = Layout.of(current)
    ranks = shape.ranks
    if shape.gpus_needed > hardware.gpus:
        raise PlanError(
            f"{shape.describe()} needs {shape.gpus_needed} GPUs but the plan has "
            f"{hardware.gpus}; give more GPUs or lower tp_size/dp_size in the current levers"
        )
    gpu = hardware.gpu_memory_bytes
    is_mla = model.shape.is_mla
    now = capacity(model, current, gpu, avg_tokens)
    new: dict[str, Any] = dict(current)
    notes: list[LeverNote] = []
    honest: list[str] = []

    # 1. fp8 KV: half the bytes per token.
    if not is_fp8(now.kv_cache_dtype):
        new["kv_cache_dtype"] = PROPOSED_FP8_DTYPE
    # 2. chunked prefill within the reserve floor.
    default_chunk = sglang_default_chunked_prefill(gpu / MiB)
    cur_chunk = lever_int(current, "chunked_prefill_size")
    start = cur_chunk if cur_chunk is not None and cur_chunk > 0 else default_chunk
    chunk = _chunk_under_floor(gpu, new, is_mla, start)
    if chunk != (cur_chunk if cur_chunk is not None else default_chunk):
        new["chunked_prefill_size"] = chunk
    # 3-5. fraction, concurrency and graphs (the graph reserve depends on the batch, the
    # batch on the capacity): size with SGLang's default batch first, then the matched one.
    for _ in range(3):
        new["mem_fraction_static"] = sglang_reserve(gpu, new, is_mla).safe_fraction
        tokens = pool_tokens(model, new, gpu)
        fit = tokens // avg_tokens
        running = max(1, min(fit, target_concurrency) if target_concurrency else fit)
        bs = min(round_up_graph_bs(running), MAX_PROPOSED_GRAPH_BS)
        if new.get("max_running_requests") == running and new.get("cuda_graph_max_bs_decode") == bs:
            break
        new["max_running_requests"] = running
        new["cuda_graph_max_bs_decode"] = bs
    # The fraction was computed with a batch at least as large as the final one: safe.
    new["mem_fraction_static"] = min(
        new["mem_fraction_static"], sglang_reserve(gpu, new, is_mla).safe_fraction
    )
    # 6. the host cache.
    budget = host_cache_budget_per_rank(hardware.host_ram_available_bytes, ranks)
    tokens = pool_tokens(model, new, gpu)
    new_cell = cell_bytes(model.shape, tp, str(new.get("kv_cache_dtype") or "auto"), pp)
    size_gb = budget // GB
    host_tokens = int(size_gb * GB // new_cell)
    if size_gb >= 1 and host_tokens > tokens:
        new["enable_hierarchical_cache"] = True
        new["hicache_size"] = int(size_gb)
    elif lever_bool(new, "enable_hierarchical_cache") and (
        host_pool_bytes_per_rank(new, gpu) > budget
    ):
        # The operator's host cache does not fit (sized as preflight sizes it): shrink it.
        if size_gb >= 1:
            new["hicache_size"] = int(size_gb)
        else:
            new["enable_hierarchical_cache"] = False
    after = capacity(model, new, gpu, avg_tokens)
    changes = {
        k: new[k]
        for k in sorted(new, key=lambda k: _LEVER_ORDER.get(k, len(_LEVER_ORDER)))
        if current.get(k) != new[k]
    }

    # --- the reasons ---
    for lever, value in changes.items():
        notes.append(
            LeverNote(
                lever,
                current[lever] if lever in current else _in_effect(lever, now),
                value,
                _reason(lever, now, after, gpu_bytes=gpu, budget=budget, ranks=ranks),
                current_is_default=lever not in current,
            )
        )
    honest.append(
        "The hierarchical cache raises prefix reuse (the cache hit rate): evicted prefixes "
        "are kept in host RAM and loaded back instead of recomputed. It does not raise the "
        "number of requests decoding at once — running requests' KV lives on the GPU."
    )
    if "kv_cache_dtype" in changes:
        honest.append(
            f"fp8 KV cache ({PROPOSED_FP8_DTYPE}) may cost accuracy: K and V are stored in 8 "
            "bits (with scale 1.0 unless the checkpoint ships KV scales); long-context and "
            "reasoning tasks are the most sensitive. Check your evals; kv_cache_dtype=auto "
            "undoes it."
        )
    if model.weight_source.startswith("estimated"):
        honest.append(
            "Weights are estimated from config.json (±10%): give a model directory with its "
            "safetensors (or model.safetensors.index.json) for exact sizes."
        )
    honest.append(
        "KV tokens are estimated as (mem_fraction_static × GPU memory − weights) / bytes per "
        "token; real SGLang also loses the CUDA context and NCCL buffers (about 1–3 GiB per "
        "GPU), so its logged #tokens will be a few percent lower."
    )
    if after.host_ram_needed_bytes:
        honest.append(
            f"The host pool pins {after.host_ram_needed_bytes / GiB:.0f} GiB of host RAM: "
            "stopping the server takes longer (≈0.2 s per pinned GiB measured on H200), and "
            "the supervisor's release deadline grows with it."
        )
    if not after.hierarchical_cache:
        honest.append(
            f"No hierarchical cache: {hardware.host_ram_available_bytes / GiB:,.0f} GiB of "
            f"available host RAM leaves {budget / GB:,.0f} GB per rank after SGLang's 10 GiB "
            f"margin and OS headroom, which does not exceed the device pool "
            f"({after.kv_bytes_per_rank / GB:,.0f} GB per rank); a host pool pays off only "
            "when it is larger."
        )
    if dp > 1:
        honest.append(
            f"dp_size={dp}: each of the {dp} replicas has its own pool; concurrent requests "
            "are summed over replicas."
        )
    if after.kv_tokens_per_rank < avg_tokens:
        honest.append(
            f"One request of {avg_tokens} tokens does not fit the KV pool "
            f"({after.kv_tokens_per_rank} tokens): raise tp_size (more GPUs) or shorten requests."
        )
    if target_concurrency and after.concurrent_requests < target_concurrency:
        need = target_concurrency * avg_tokens // max(1, dp)
        honest.append(
            f"The target of {target_concurrency} concurrent requests needs {need} KV tokens "
            f"per replica at {avg_tokens} tokens each; the proposal holds "
            f"{after.kv_tokens_per_rank}. Beyond this, only more GPUs (a larger tp_size or "
            "more replicas) or shorter requests help."
        )
    cap = parse_count(new.get("max_total_tokens"))
    if cap is not None:
        honest.append(f"max_total_tokens={cap} caps the pool; remove it to use the full capacity.")
    return Plan(
        model=model,
        hardware=hardware,
        avg_tokens=avg_tokens,
        avg_tokens_source=avg_tokens_source,
        target_concurrency=target_concurrency,
        diagnosis=(live or LiveLoad()).diagnosis(),
        current_levers=current,
        current=now,
        proposed=after,
        levers=changes,
        lever_notes=notes,
        notes=honest,
        live=live,
        reserve=sglang_reserve(gpu, new, is_mla).to_json(),
    )


def _in_effect(lever: str, now: Capacity) -> Any:
    """What an unset ``lever`` amounts to in SGLang (None where it derives it at start)."""
    return {
        "kv_cache_dtype": now.kv_cache_dtype,
        "mem_fraction_static": now.mem_fraction_static,
        "chunked_prefill_size": now.chunked_prefill_size,
        "cuda_graph_max_bs_decode": now.cuda_graph_max_bs_decode,
        "enable_hierarchical_cache": now.hierarchical_cache,
    }.get(lever)


def _reason(
    lever: str, now: Capacity, after: Capacity, *, gpu_bytes: int, budget: int, ranks: int
) -> str:
    """One line on what changing ``lever`` does, with the numbers."""
    if lever == "kv_cache_dtype":
        return (
            f"8-bit K/V: {now.cell_bytes:,} -> {after.cell_bytes:,} bytes per token per rank, so "
            "the same memory holds twice the tokens (see the accuracy note)"
        )
    if lever == "mem_fraction_static":
        per_hundredth = int(0.01 * gpu_bytes // max(1, after.cell_bytes))
        return (
            f"the highest fraction within SGLang's own reserve for activations and CUDA "
            f"graphs ({after.safe_mem_fraction:.3f}); each 0.01 is {per_hundredth:,} more KV "
            "tokens per rank"
        )
    if lever == "chunked_prefill_size":
        return (
            f"prefill in chunks of {after.chunked_prefill_size:,} tokens keeps SGLang's "
            "activation reserve within its 10 GiB floor, leaving the rest to KV; long prompts "
            "take a few more prefill steps"
        )
    if lever == "max_running_requests":
        return (
            f"{after.kv_tokens_per_rank:,} KV tokens hold {after.concurrent_requests:,} requests "
            f"of {after.avg_tokens:,} tokens; admitting more makes SGLang retract (evict and "
            "recompute) running requests"
        )
    if lever == "cuda_graph_max_bs_decode":
        return (
            f"capture decode CUDA graphs up to batch {after.cuda_graph_max_bs_decode} so every "
            "decode batch the KV allows replays a graph (larger batches run eagerly, slower)"
        )
    if lever == "enable_hierarchical_cache":
        if not after.hierarchical_cache:
            return "not enough host RAM for a host pool larger than the device pool"
        return (
            "keep evicted prefixes in host RAM: a higher cache hit rate for shared prefixes, "
            "not more running requests"
        )
    if lever == "hicache_size":
        return (
            f"{after.host_pool_tokens_per_rank:,} host tokens per rank "
            f"({after.host_pool_tokens_per_rank / max(1, after.kv_tokens_per_rank):.1f}× the "
            f"device pool) = {after.host_ram_needed_bytes / GB:,.0f} GB pinned over {ranks} ranks, "
            f"within the {budget * ranks / GB:,.0f} GB left after SGLang's 10 GiB margin and "
            "OS headroom"
        )
    return "changed by the plan"
