"""A checkpoint's files on this host: where a ``model_path`` is read from, which weight files
a load reads, and whether a new checkpoint is the serving one's model with other weights
(what SGLang's ``/update_weights_from_disk`` needs), all read before anything is touched.

``same_model`` compares what SGLang builds the model from — ``config.json`` (architecture,
shapes, dtype, quantization) and every tensor's name, dtype and shape in the safetensors
headers — and the tokenizer's files, which an update does not reload (the tokenizer stays
the launch's). ``read_checkpoint`` reads each shard's header and checks that the shard is
as long as the header says: a shard missing, unreadable or cut short is named.
Everything here blocks (file reads): call it from a worker thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Files the tokenizer (and chat template, generation defaults) is read from at launch.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "preprocessor_config.json",
)
#: config.json keys that say where or by what a checkpoint was written, not what it is.
IGNORED_CONFIG_KEYS = frozenset({"_name_or_path", "transformers_version", "_commit_hash"})
_MAX_HEADER = 100 * 2**20
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class CheckpointError(ValueError):
    """What is wrong with a checkpoint's files (the path and the file named)."""


def local_dir(model_path: str, cwd: str | None = None) -> Path | None:
    """The directory ``model_path`` names on this host, as the server reads it (relative to
    its working directory), or None when it is not one (a hub id, say)."""
    if not model_path:
        return None
    path = Path(model_path).expanduser()
    if not path.is_absolute():
        path = Path(cwd or ".") / path
    return path if path.is_dir() else None


def hub_cache(env: Mapping[str, str]) -> Path:
    """huggingface_hub's cache directory in the server's environment."""
    explicit = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("HOME") or "~", ".cache", "huggingface")
    return Path(home).expanduser() / "hub"


def hub_snapshot(repo_id: str, revision: str | None, env: Mapping[str, str]) -> Path | None:
    """The local snapshot of hub model ``repo_id`` at ``revision`` (a branch, a tag or a
    commit; ``main`` when None) in the Hugging Face cache, or None when it is not there."""
    if repo_id.count("/") != 1 or repo_id.startswith(("/", ".", "~")):
        return None
    repo = hub_cache(env) / f"models--{repo_id.replace('/', '--')}"
    rev = revision or "main"
    commit = rev if _COMMIT.match(rev) else None
    if commit is None:
        try:
            commit = (repo / "refs" / rev).read_text().strip()
        except OSError:
            return None
    snap = repo / "snapshots" / commit
    return snap if snap.is_dir() else None


def weight_files(path: Path) -> list[Path]:
    """The files a load reads: the safetensors index's shards, else every ``*.safetensors``,
    else the PyTorch ``*.bin``/``*.pt`` files (SGLang's default loader prefers them in
    that order)."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map") or {}
        except (OSError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"{index} cannot be read: {exc}") from exc
        return [path / name for name in sorted(set(map(str, weight_map.values())))]
    found = sorted(path.glob("*.safetensors"))
    return found or sorted([*path.glob("*.bin"), *path.glob("*.pt")])


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    config: Mapping[str, Any]
    files: tuple[Path, ...]
    total_bytes: int
    #: tensor name -> (dtype, shape), from the safetensors headers.
    tensors: Mapping[str, tuple[str, tuple[int, ...]]]


def _header(file: Path) -> dict[str, Any]:
    try:
        size = file.stat().st_size
        with file.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > _MAX_HEADER:
                raise CheckpointError(f"{file}: a safetensors header of {n} bytes is not one")
            header = json.loads(f.read(n))
    except FileNotFoundError as exc:
        raise CheckpointError(f"{file} is missing") from exc
    except OSError as exc:
        raise CheckpointError(f"{file} cannot be read: {exc.strerror or exc}") from exc
    except (struct.error, ValueError) as exc:
        raise CheckpointError(f"{file} is not a safetensors file: {exc}") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{file} is not a safetensors file: its header is no object")
    end = max(
        (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0
    )
    if size < 8 + n + end:
        raise CheckpointError(f"{file} is cut short: {size} bytes, its header says {8 + n + end}")
    return header


def read_checkpoint(path: Path) -> Checkpoint:
    """``config.json`` and every shard's header; ``CheckpointError`` names what is wrong."""
    try:
        config = json.loads((path / "config.json").read_text())
    except FileNotFoundError as exc:
        raise CheckpointError(f"{path} has no config.json") from exc
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}/config.json cannot be read: {exc}") from exc
    files = weight_files(path)
    if not files:
        raise CheckpointError(f"{path} has no weight files (*.safetensors)")
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    total = 0
    for file in files:
        if file.suffix != ".safetensors":
            raise CheckpointError(f"{file}: only safetensors headers can be compared here")
        if not file.is_file():
            raise CheckpointError(f"{file} is missing")
        if not os.access(file, os.R_OK):
            raise CheckpointError(f"{file} cannot be read by this user")
        for name, entry in _header(file).items():
            if name != "__metadata__" and isinstance(entry, dict):
                tensors[name] = (str(entry.get("dtype")), tuple(entry.get("shape") or ()))
        total += file.stat().st_size
    return Checkpoint(path, config, tuple(files), total, tensors)


def same_model(old: Checkpoint, new: Checkpoint) -> str | None:
    """None when ``new`` is ``old``'s model with other weights; else what differs."""
    keys = (set(old.config) | set(new.config)) - IGNORED_CONFIG_KEYS
    changed = sorted(k for k in keys if old.config.get(k) != new.config.get(k))
    if changed:
        k = changed[0]
        return (
            f"config.json differs in {', '.join(changed[:5])}"
            f"{' ...' if len(changed) > 5 else ''} ({k}: {old.config.get(k)!r} -> "
            f"{new.config.get(k)!r})"
        )
    if old.tensors.keys() != new.tensors.keys():
        extra = sorted(new.tensors.keys() - old.tensors.keys())
        gone = sorted(old.tensors.keys() - new.tensors.keys())
        return (
            f"the tensors differ: {len(extra)} new ({', '.join(extra[:2])}), "
            f"{len(gone)} gone ({', '.join(gone[:2])})"
        )
    for name, was in old.tensors.items():
        now = new.tensors[name]
        if was != now:
            return f"tensor {name} differs: {was[0]} {list(was[1])} -> {now[0]} {list(now[1])}"
    return None


def tokenizer_differs(old: Path, new: Path) -> list[str]:
    """The tokenizer files whose content differs between two checkpoints (or that one
    has and the other not)."""

    def digest(p: Path) -> str | None:
        try:
            return hashlib.sha256(p.read_bytes()).hexdigest()
        except OSError:
            return None

    return [n for n in TOKENIZER_FILES if digest(old / n) != digest(new / n)]
