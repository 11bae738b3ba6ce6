"""A checkpoint's files, read before a weights update touches anything
(``sglang_supervisor.host.checkpoint_files``): the same model or not, and shards that no
load could read."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_supervisor.host.checkpoint_files import (
    CheckpointError,
    hub_snapshot,
    read_checkpoint,
    same_model,
    tokenizer_differs,
)
from tests.checkpoints import TENSORS, TINY_LLAMA, write_checkpoint


def test_other_weights_of_the_same_model_are_the_same_model(tmp_path: Path) -> None:
    a = read_checkpoint(write_checkpoint(tmp_path / "a", fill=1))
    b = read_checkpoint(write_checkpoint(tmp_path / "b", fill=2))
    assert same_model(a, b) is None
    assert a.total_bytes == b.total_bytes > 2 * 1024 * 256 * 2


def test_a_dtype_shape_or_config_change_is_another_model(tmp_path: Path) -> None:
    a = read_checkpoint(write_checkpoint(tmp_path / "a"))
    fp8 = {f: {n: ("F8_E4M3", shape) for n, (_, shape) in t.items()} for f, t in TENSORS.items()}
    quantized = read_checkpoint(write_checkpoint(tmp_path / "q", tensors=fp8))
    assert same_model(a, quantized) == (
        "tensor model.embed_tokens.weight differs: BF16 [1024, 256] -> F8_E4M3 [1024, 256]"
    )
    layers = read_checkpoint(
        write_checkpoint(tmp_path / "l", config={**TINY_LLAMA, "num_hidden_layers": 3})
    )
    assert (
        same_model(a, layers)
        == "config.json differs in num_hidden_layers (num_hidden_layers: 2 -> 3)"
    )
    renamed = read_checkpoint(
        write_checkpoint(tmp_path / "n", config={**TINY_LLAMA, "_name_or_path": "x"})
    )
    assert same_model(a, renamed) is None  # where it was written from is not what it is


def test_a_shard_missing_or_cut_short_is_named(tmp_path: Path) -> None:
    ck = write_checkpoint(tmp_path / "a")
    shard = ck / "model-00002-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:-10])
    with pytest.raises(CheckpointError, match=r"model-00002-of-00002\.safetensors is cut short"):
        read_checkpoint(ck)
    shard.unlink()
    with pytest.raises(CheckpointError, match=r"model-00002-of-00002\.safetensors is missing"):
        read_checkpoint(ck)


def test_the_tokenizer_an_update_keeps_is_compared(tmp_path: Path) -> None:
    a = write_checkpoint(tmp_path / "a")
    b = write_checkpoint(tmp_path / "b", tokenizer='{"version": "2.0"}')
    assert tokenizer_differs(a, a) == []
    assert tokenizer_differs(a, b) == ["tokenizer.json"]


def test_a_hub_model_is_found_in_the_cache_at_its_revision(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "models--org--m"
    (repo / "refs").mkdir(parents=True)
    commit = "a" * 40
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    env = {"HF_HUB_CACHE": str(tmp_path / "hub")}
    assert hub_snapshot("org/m", None, env) == repo / "snapshots" / commit
    assert hub_snapshot("org/m", commit, env) == repo / "snapshots" / commit
    assert hub_snapshot("org/m", "v2", env) is None
    assert hub_snapshot("/local/dir", None, env) is None
