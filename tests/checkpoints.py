"""Small real checkpoints for the tests: a Llama-shaped ``config.json``, a tokenizer file,
and safetensors shards (a valid header, then the tensors' bytes), with an index."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: A tiny Llama the simulated server sizes its KV pool for (weights from the files).
TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
}
#: name -> (dtype, shape) of each shard's tensors.
TENSORS: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {
    "model-00001-of-00002.safetensors": {"model.embed_tokens.weight": ("BF16", (1024, 256))},
    "model-00002-of-00002.safetensors": {"lm_head.weight": ("BF16", (1024, 256))},
}
_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1}


def write_shard(
    path: Path, tensors: Mapping[str, tuple[str, tuple[int, ...]]], fill: int = 1
) -> int:
    """A safetensors file holding ``tensors`` (every byte ``fill``); its size."""
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = _BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        f.write(bytes([fill]) * offset)
    return 8 + len(blob) + offset


def write_checkpoint(
    where: Path,
    *,
    fill: int = 1,
    config: Mapping[str, Any] | None = None,
    tensors: Mapping[str, Mapping[str, tuple[str, tuple[int, ...]]]] | None = None,
    tokenizer: str = '{"version": "1.0"}',
) -> Path:
    """A checkpoint directory: config.json, tokenizer.json, the shards and their index."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "config.json").write_text(json.dumps(dict(config or TINY_LLAMA)))
    (where / "tokenizer.json").write_text(tokenizer)
    weight_map: dict[str, str] = {}
    total = 0
    for file, shard in (tensors or TENSORS).items():
        total += write_shard(where / file, shard, fill)
        weight_map.update({name: file for name in shard})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (where / "model.safetensors.index.json").write_text(json.dumps(index))
    return where
