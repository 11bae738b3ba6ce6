"""What a simulated launch compiles and keeps under ``SGLANG_CACHE_DIR``, as SGLang 0.5.23
keeps its JIT caches there (``srt/environ.py`` ``third_party_cache_defaults``: Triton,
TorchInductor, CUDA, TileLang, FlashInfer): the first launch of a shape "compiles" (a
file written), later ones with the same shape find it and say so. Unset, the directory
is SGLang's default, ``~/.cache/sglang``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from sglang_supervisor.sim.flags import ServerConfig

#: Bytes of one simulated compiled-kernel file.
KERNEL_BYTES = 64 * 1024


def compile_kernels(cfg: ServerConfig, env: Mapping[str, str]) -> str:
    """Find or "compile" this launch's kernels; the log line saying which."""
    base = Path(env.get("SGLANG_CACHE_DIR") or os.path.expanduser("~/.cache/sglang"))
    shape = f"{cfg.model_path}|tp{cfg.tp_size}|pp{cfg.pp_size}|{cfg.kv_cache_dtype}"
    key = hashlib.sha256(shape.encode()).hexdigest()[:16]
    path = base.expanduser() / "triton" / f"sim-kernels-{key}.bin"
    if path.is_file():
        return f"JIT kernels: cache hit, reusing {path}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(b"\x7f" * KERNEL_BYTES)
        os.replace(tmp, path)
    except OSError as exc:
        return f"JIT kernels: compiled, but {path} cannot be written ({exc.strerror or exc})"
    return f"JIT kernels: cache miss, compiled into {path}"
