"""The stand-in's model load: each rank reads its share of the model directory's safetensors
files onto its GPU, as SGLang's default loader does (``safetensors.torch.load_file`` on the
rank's device when safetensors is installed, else the same bytes through a plain read and
``torch.frombuffer(...).to(device)``); with fake GPUs (``SGLANG_STANDIN_FAKE_GPU_DIR``) the
files are read into memory and dropped. A model directory without weight files (the
end-to-end test's tiny config) loads nothing.

Rank ``r`` of ``n`` loads files ``r, r + n, ...`` of the index's shards (else of the
``*.safetensors`` files, sorted), so a tensor-parallel stand-in spreads the bytes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

CHUNK = 16 * 2**20


def weight_files(model_path: str) -> list[Path]:
    root = Path(model_path).expanduser()
    index = root / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(map(str, json.loads(index.read_text())["weight_map"].values())))
        return [root / n for n in names]
    return sorted(root.glob("*.safetensors")) if root.is_dir() else []


def _read(path: Path) -> int:
    buf = bytearray(CHUNK)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            total += n
    return total


def _plain_to(path: Path, device: int) -> Any:
    """One safetensors file onto ``device``: the header, then the bytes (one read)."""
    import torch

    size = path.stat().st_size
    data = bytearray(size)
    with open(path, "rb", buffering=0) as f:
        view = memoryview(data)
        got = 0
        while got < size and (n := f.readinto(view[got:])):
            got += n
    n = int.from_bytes(data[:8], "little")
    header = json.loads(bytes(data[8 : 8 + n]))
    flat = torch.frombuffer(data, dtype=torch.uint8)
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        out[name] = flat[8 + n + begin : 8 + n + end].to(f"cuda:{device}")
    return out


def load(model_path: str, rank: int, ranks: int, device: int | None) -> tuple[Any, dict[str, Any]]:
    """Load this rank's share; returns what holds it (keep it referenced) and the figures."""
    files = weight_files(model_path)[rank :: max(1, ranks)]
    t0 = time.monotonic()
    held: list[Any] = []
    loader = "none"
    total = 0
    if files and device is None:
        loader = "read (fake GPU)"
        total = sum(_read(f) for f in files)
    elif files:
        import torch

        try:
            from safetensors.torch import load_file
        except ImportError:
            loader = "plain read + torch.frombuffer().to(cuda)"
            held = [_plain_to(f, device) for f in files]
        else:
            loader = "safetensors.torch.load_file"
            held = [load_file(str(f), device=f"cuda:{device}") for f in files]
        torch.cuda.synchronize(device)
        total = sum(f.stat().st_size for f in files)
    info = {
        "weights_files": len(files),
        "weights_bytes": total,
        "weights_s": round(time.monotonic() - t0, 3),
        "weights_loader": loader,
    }
    return held, info
