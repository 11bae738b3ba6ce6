"""SGLang 0.5.23's own resolved arguments for a lever set, on a CPU host (the oracle the
planner's tests cite for ``mem_fraction_static`` and friends).

Runs ``ServerArgs.resolve_once`` — SGLang's whole resolution pipeline — with an H200
supplied: CUDA reported available, SM90, 8 devices, 143771 MiB each. Kernel packages the
pipeline only imports (triton, flashinfer, ...) are stubbed; nothing runs on a device.

    pip install --target /tmp/oracle-site transformers==5.19.0 tokenizers==0.23.2 \\
        dill xxhash zstandard            # what the parser env (.venv-sglang) lacks
    PYTHONPATH=/tmp/oracle-site .venv-sglang/bin/python scripts/sglang-oracle.py \\
        --model-path DIR_WITH_CONFIG_JSON --tp 8 --attn-dp-size 8

Prints the resolved values as JSON. ``SGLANG_ORACLE_GPU_MIB`` changes the memory.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import logging
import os
import sys
import types
from typing import Any

#: Packages the resolution pipeline imports but never needs on a CPU host.
STUBBED = {
    "torchvision", "triton", "sgl_kernel", "flashinfer", "decord", "soundfile", "av",
    "cv2", "timm", "einops", "outlines", "xgrammar", "llguidance", "partial_json_parser",
    "compressed_tensors", "openai", "tiktoken", "sentencepiece", "blobfile", "interegular",
    "modelscope", "setproctitle", "uvloop", "uvicorn", "fastapi", "hf_transfer",
    "prometheus_client", "nvidia", "pynvml", "cuda", "torchao", "gguf", "datasets", "scipy",
    "numba", "tvm_ffi",
}  # fmt: skip
KEYS = (
    "mem_fraction_static", "chunked_prefill_size", "max_running_requests", "attn_dp_size",
    "dp_size", "schedule_conservativeness", "kv_cache_dtype", "moe_a2a_backend",
    "page_size", "swa_full_tokens_ratio", "mamba_full_memory_ratio", "hicache_ratio",
    "hicache_host_memory_fraction",
)  # fmt: skip


class _Meta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _make(name)

    def __getitem__(cls, key: Any) -> Any:
        return cls


def _make(name: str) -> Any:
    def call(self: Any, *a: Any, **k: Any) -> Any:
        return a[0] if len(a) == 1 and callable(a[0]) and not k else _make("r")()

    def attr(self: Any, n: str) -> Any:
        if n.startswith("__"):
            raise AttributeError(n)
        return _make(n)()

    return _Meta(name, (), {"__init__": lambda self, *a, **k: None, "__call__": call,
                            "__getattr__": attr, "__iter__": lambda s: iter(()),
                            "__bool__": lambda s: False})  # fmt: skip


class _Module(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _make(name)
        setattr(self, name, value)
        return value


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:
        module = _Module(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: Any) -> None:
        pass


def main(argv: list[str]) -> int:
    import transformers.utils.import_utils as iu

    # Decide "no torchvision" before the stubs make it importable.
    iu.is_torchvision_available()
    iu.is_torchvision_v2_available()
    iu.is_torchvision_greater_or_equal("0.27")
    sys.meta_path.append(_Stubs())
    logging.disable(logging.WARNING)
    import torch

    mib = int(os.environ.get("SGLANG_ORACLE_GPU_MIB", "143771"))
    torch.cuda.is_available = lambda: True  # type: ignore[assignment]
    torch.version.cuda = "12.9"  # type: ignore[misc]
    torch.cuda.device_count = lambda: 8  # type: ignore[assignment]
    torch.cuda.get_device_capability = lambda d=None: (9, 0)  # type: ignore[assignment]
    torch.cuda.get_device_name = lambda d=None: "NVIDIA H200"  # type: ignore[assignment]
    import sglang.srt.arg_groups.memory_hook as memory_hook
    import sglang.srt.utils.common as common
    from sglang.srt.runtime_context import override_platform

    common.get_device_memory_capacity = lambda device=None: mib
    common.get_device = lambda device_id=None: "cuda" if device_id is None else f"cuda:{device_id}"
    common.get_device_count = lambda: 8
    memory_hook.get_device_memory_capacity = lambda device=None: mib
    override_platform(
        is_cuda=True, is_hip=False, is_npu=False, is_xpu=False, is_musa=False, is_mps=False,
        is_sm90=True, is_sm100=False, is_sm100_or_sm110=False, is_sm110=False,
        is_sm120=False, is_blackwell=False, is_hopper_with_cuda_12_3=True, has_amx=False,
        has_flashinfer=True, device_sm=90, device_capability=(9, 0),
    ).install()  # fmt: skip
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(argv)
    args.resolve_once()
    resolved = args.resolved_dict()
    out = {k: resolved.get(k) for k in KEYS}
    graphs = resolved["cuda_graph_config"]
    out["decode_graph"] = {k: graphs["decode"][k] for k in ("backend", "max_bs")}
    out["prefill_graph"] = {k: graphs["prefill"][k] for k in ("backend", "max_bs")}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
