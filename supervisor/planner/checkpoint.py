"""A model from its checkpoint: ``config.json``, the safetensors index, the weights' bytes.

The only I/O of the planner: reading a model directory. Weights come from the index's
``metadata.total_size`` (else the safetensors files' sizes, else an estimate from
``config.json``); ModelOpt's ``hf_quant_config.json`` is read for its KV quantization.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sglang_supervisor.files import FileRefused, read_json
from sglang_supervisor.planner.model import (
    MiB,
    ModelShape,
    ModelSpec,
    PlanError,
    _cfg_int,
    _cfg_opt_int,
    _text_config,
)

#: A config.json is kilobytes (the largest Hugging Face ones, ~100 KB).
MAX_CONFIG_BYTES = 4 * MiB
#: A safetensors index lists every tensor: ~9 MB for the largest checkpoints.
MAX_INDEX_BYTES = 64 * MiB

_BYTES_PER_DTYPE = {
    "float32": 2,  # SGLang serves fp32 checkpoints in fp16 ("auto")
    "float": 2,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
}


def _linear_bytes_per_param(config: Mapping[str, Any]) -> tuple[float, str]:
    """Bytes per weight of the linear layers, and the precision in words."""
    quant = config.get("quantization_config")
    if isinstance(quant, Mapping):
        method = str(quant.get("quant_method") or quant.get("quant_algo") or "").lower()
        bits = quant.get("bits") or quant.get("w_bit") or _compressed_tensors_bits(quant)
        if isinstance(bits, int) and not isinstance(bits, bool) and bits > 0:
            group = _group_size(quant)
            # A bf16 scale per group (GPTQ, AWQ, compressed-tensors' group strategy).
            scales = 2 / group if group else 0.0
            return bits / 8 + scales, f"{bits}-bit ({method or 'quantized'})"
        if "fp4" in method:
            return 0.5, method
        if "fp8" in method or "int8" in method or method == "w8a8":
            return 1.0, method
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return float(_BYTES_PER_DTYPE.get(dtype, 2)), dtype


def _compressed_tensors_bits(quant: Mapping[str, Any]) -> int | None:
    """compressed-tensors' weight bits (``config_groups.*.weights.num_bits``), when every
    group agrees."""
    groups = quant.get("config_groups")
    if not isinstance(groups, Mapping):
        return None
    bits = {
        g.get("weights", {}).get("num_bits")
        for g in groups.values()
        if isinstance(g, Mapping) and isinstance(g.get("weights"), Mapping)
    }
    (only,) = bits if len(bits) == 1 else (None,)
    return only if isinstance(only, int) and not isinstance(only, bool) else None


def _group_size(quant: Mapping[str, Any]) -> int | None:
    """The weights' quantization group (``group_size``, or compressed-tensors' groups')."""
    size = quant.get("group_size") or quant.get("q_group_size")
    groups = quant.get("config_groups")
    if size is None and isinstance(groups, Mapping):
        for g in groups.values():
            weights = g.get("weights") if isinstance(g, Mapping) else None
            if isinstance(weights, Mapping):
                size = weights.get("group_size")
                break
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def _attention_unquantized(quant: Any) -> bool:
    """Whether the quantization leaves ``self_attn`` in bf16: listed in
    ``modules_to_not_convert`` (gpt-oss, ModelOpt) or compressed-tensors' ``ignore``
    (Kimi-K2.5: ``re:.*self_attn.*``)."""
    if not isinstance(quant, Mapping):
        return False
    for key in ("modules_to_not_convert", "ignore"):
        skipped = quant.get(key)
        if isinstance(skipped, list) and any("self_attn" in str(m) for m in skipped):
            return True
    return False


def attention_params(config: Mapping[str, Any], *, all_layers: bool = False) -> int:
    """Parameters of the attention projections (MHA/GQA, or MLA's low-rank ones) of the
    full-attention layers (of every layer with ``all_layers``, as a size estimate)."""
    cfg = _text_config(config)
    shape = ModelShape.from_config(config)
    h, layers, heads = shape.hidden_size, shape.num_layers, shape.num_attention_heads
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
        per_layer = q + kv + heads * v_dim * h
    else:
        d = shape.head_dim
        per_layer = 2 * h * heads * d + 2 * h * shape.num_kv_heads * d
    return (layers if all_layers else layers - shape.linear_layers) * per_layer


def attention_weight_bytes(config: Mapping[str, Any]) -> int:
    """Bytes of the attention projections: bf16 where the quantization leaves
    ``self_attn`` out (gpt-oss), else the linear layers' precision."""
    per_param, _ = _linear_bytes_per_param(_text_config(config))
    if _attention_unquantized(_text_config(config).get("quantization_config")):
        per_param = 2.0
    return int(attention_params(config) * per_param)


def estimate_params(config: Mapping[str, Any]) -> tuple[int, int]:
    """(linear-layer parameters, embedding parameters) estimated from ``config.json``.

    Counts the attention projections (MHA/GQA, or MLA's low-rank ones), the MLP (dense,
    or MoE: routed + shared experts + router; DeepSeek's ``first_k_dense_replace`` and
    Qwen's ``mlp_only_layers`` are dense; Llama-4 adds a shared expert and interleaves
    MoE layers every ``interleave_moe_layer_step``), a vision tower and the embeddings
    (doubled unless tied). Norms, biases and multi-token-prediction layers are left out
    (< 1%).
    """
    cfg = _text_config(config)
    shape = ModelShape.from_config(config)
    h, layers = shape.hidden_size, shape.num_layers
    vocab = _cfg_int(cfg, "vocab_size", default=32000)
    tied = bool(cfg.get("tie_word_embeddings", False))
    embed = vocab * h * (1 if tied else 2)
    attn = attention_params(config, all_layers=True)
    inter = _cfg_int(cfg, "intermediate_size", "ffn_hidden_size", default=4 * h)
    experts = _cfg_int(cfg, "n_routed_experts", "num_experts", "num_local_experts", default=0)
    if experts > 0:
        moe_inter = _cfg_int(cfg, "moe_intermediate_size", default=inter)
        shared = _cfg_int(cfg, "n_shared_experts", default=0) * 3 * h * moe_inter
        shared += 3 * h * _cfg_int(cfg, "shared_expert_intermediate_size", default=0)
        if shape.model_type == "llama4_text" or cfg.get("model_type") == "llama4_text":
            shared += 3 * h * inter  # Llama-4: one shared expert in every MoE layer
        moe_layer = experts * 3 * h * moe_inter + shared + h * experts
        only_dense = cfg.get("mlp_only_layers")
        dense = _cfg_int(cfg, "first_k_dense_replace", default=0) + (
            len(only_dense) if isinstance(only_dense, list) else 0
        )
        step = _cfg_int(cfg, "interleave_moe_layer_step", default=1)
        if step > 1:
            dense += layers - layers // step  # Llama-4 Maverick: every step-th layer is MoE
        dense = min(dense, layers)
        dense_inter = _cfg_int(cfg, "intermediate_size_mlp", default=inter)
        mlp = dense * 3 * h * dense_inter + (layers - dense) * moe_layer
    else:
        mlp = layers * 3 * h * inter
    return attn + mlp + vision_params(config), embed


def vision_params(config: Mapping[str, Any]) -> int:
    """A vision tower's parameters (in the checkpoint, loaded where SGLang serves the model
    multimodal): per layer 4 h² of attention and 2 h × intermediate of MLP."""
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        return 0
    h = _cfg_int(vision, "hidden_size", "vt_hidden_size", default=0)
    layers = _cfg_int(vision, "num_hidden_layers", "vt_num_hidden_layers", "depth", default=0)
    inter = _cfg_int(vision, "intermediate_size", "vt_intermediate_size", default=4 * h)
    return layers * (4 * h * h + 2 * h * inter)


def estimate_weight_bytes(config: Mapping[str, Any]) -> tuple[int, str]:
    """Weight bytes estimated from ``config.json`` and a sentence saying how."""
    linear, embed = estimate_params(config)
    per_param, precision = _linear_bytes_per_param(_text_config(config))
    attn = 0
    if per_param < 2 and _attention_unquantized(_text_config(config).get("quantization_config")):
        attn = attention_params(config, all_layers=True)  # kept in bf16
    total = int((linear - attn) * per_param + attn * 2 + embed * 2)
    return total, (
        f"estimated from config.json: {(linear + embed) / 1e9:.1f}e9 parameters, "
        f"{precision} ({per_param:g} B each), ±10%"
    )


_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1}


def _tensor_bytes(file: Path, names: set[str]) -> int | None:
    """Bytes of ``names`` in one safetensors file, from its header alone."""
    try:
        with file.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > 100 * MiB:
                return None
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error):
        return None
    total = 0
    for name in names:
        entry = header.get(name)
        if not isinstance(entry, dict):
            return None
        begin, end = entry.get("data_offsets", (0, 0))
        total += int(end) - int(begin)
    return total


def mtp_weight_bytes(path: Path, num_layers: int, nextn: int, total: int) -> int:
    """Bytes of the MTP layers (``model.layers.{≥ num_layers}.*``) in a checkpoint: from
    the safetensors headers when the files are there, else ``total × nextn / (layers +
    nextn)`` (one average layer each)."""
    if nextn <= 0:
        return 0
    index = path / "model.safetensors.index.json"
    try:
        weight_map = read_json(index, "index", max_bytes=MAX_INDEX_BYTES).get("weight_map") or {}
    except (OSError, ValueError, AttributeError):
        weight_map = {}
    by_file: dict[str, set[str]] = {}
    for name, file in weight_map.items():
        parts = str(name).split(".")
        layer = parts[2] if len(parts) > 2 and parts[:2] == ["model", "layers"] else ""
        if layer.isdigit() and int(layer) >= num_layers:
            by_file.setdefault(str(file), set()).add(str(name))
    exact = 0
    for file, names in by_file.items():
        got = _tensor_bytes(path / file, names)
        if got is None:
            break
        exact += got
    else:
        if by_file:
            return exact
    return total * nextn // (num_layers + nextn)


def weight_bytes_from_dir(path: Path) -> tuple[int, str] | None:
    """Weight bytes of a local checkpoint: the index's ``metadata.total_size``, else the
    sum of its ``*.safetensors`` file sizes (headers included, < 0.1%); None when neither."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            data = read_json(index, "index", max_bytes=MAX_INDEX_BYTES)
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
    mtp_weight_bytes: int | None = None,
) -> ModelSpec:
    """A ``ModelSpec`` from a config mapping; weights estimated unless given (an
    estimate leaves the MTP layers out; given weights are taken to include them, one
    average layer each, unless ``mtp_weight_bytes`` says)."""
    shape = ModelShape.from_config(config)
    nextn = shape.num_nextn_predict_layers
    if weight_bytes is None:
        weight_bytes, weight_source = estimate_weight_bytes(config)
        if nextn:
            # The estimate counts the main layers only: add the MTP layers' share.
            mtp_weight_bytes = weight_bytes * nextn // shape.num_layers
            weight_bytes += mtp_weight_bytes
    elif mtp_weight_bytes is None:
        mtp_weight_bytes = int(weight_bytes) * nextn // (shape.num_layers + nextn)
    ctx = context_length(config)
    return ModelSpec(
        name=name,
        source=source,
        shape=shape,
        weight_bytes=int(weight_bytes),
        weight_source=weight_source or "given",
        context_length=ctx,
        mtp_weight_bytes=int(mtp_weight_bytes or 0),
        attention_weight_bytes=attention_weight_bytes(config),
    )


def read_config(path: Path) -> dict[str, Any]:
    """A ``config.json`` as a dict; ``PlanError`` saying what is wrong with the file.
    Bounded (``files.read_json``): a regular file of at most ``MAX_CONFIG_BYTES``, nested
    at most 64 levels — POST /plan reads any directory the caller names, as the daemon's
    user (a 300 MB file, 14 times at once, took the daemon to 2.4 GB; a deeply nested one
    was a bare 500)."""
    try:
        data = read_json(path, "model config", max_bytes=MAX_CONFIG_BYTES)
    except FileNotFoundError as exc:
        raise PlanError(f"{path} does not exist: give a model directory with config.json") from exc
    except OSError as exc:
        raise PlanError(f"cannot read {path}: {exc.strerror}") from exc
    except FileRefused as exc:
        raise PlanError(str(exc)) from exc
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
    quant = path / "hf_quant_config.json"
    if quant.is_file():
        config["_hf_quant_config"] = read_config(quant)
    found = weight_bytes_from_dir(path)
    weights, how = found if found is not None else (None, None)
    mtp = None
    if weights is not None:
        shape = ModelShape.from_config(config)
        mtp = mtp_weight_bytes(path, shape.num_layers, shape.num_nextn_predict_layers, weights)
    return model_from_config(
        config,
        name=path.name,
        source=f"config.json in {path}",
        weight_bytes=weights,
        weight_source=how,
        mtp_weight_bytes=mtp,
    )


#: SGLang's context-length keys, in its order of preference
#: (``srt/utils/hf_transformers/common.py:669-675``).
CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)
#: transformers' default ``max_position_embeddings`` for text configs whose config.json
#: leaves it out (SGLang reads the config object, defaults filled in):
#: ``Gemma3TextConfig`` (transformers 5.19 ``models/gemma3/configuration_gemma3.py:85``).
CONTEXT_DEFAULTS = {"gemma3_text": 131_072}
#: Text configs whose rope parameters transformers nests per layer type, so SGLang's
#: ``rope_scaling.get("factor", 1)`` finds no factor (gemma-3: sliding / full).
NESTED_ROPE_TYPES = frozenset({"gemma3_text"})


def context_length(config: Mapping[str, Any]) -> int | None:
    """The context length SGLang 0.5.23 derives from the *text* config
    (``get_context_length``, ``srt/utils/hf_transformers/common.py:677-695``, called on
    ``hf_text_config`` at ``srt/configs/model_config.py:1293``): the first of its keys,
    × the rope scaling factor (not for llama3 or with ``original_max_position_embeddings``);
    transformers' default where config.json leaves the key out. None when unknown."""
    text = config.get("text_config")
    cfg: Mapping[str, Any] = text if isinstance(text, Mapping) else config
    model_type = str(cfg.get("model_type") or "")
    value: int | None = None
    for key in CONTEXT_LENGTH_KEYS:
        value = _cfg_opt_int(cfg, key)
        if value is not None:
            break
    if value is None:
        value = CONTEXT_DEFAULTS.get(model_type)
    if value is None:
        return None
    rope = cfg.get("rope_scaling")
    factor = 1.0
    if isinstance(rope, Mapping) and model_type not in NESTED_ROPE_TYPES:
        raw = rope.get("factor", 1)
        factor = float(raw) if isinstance(raw, (int, float)) else 1.0
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1.0
    return int(factor * value)
