"""SGLang 0.5.23's own KV pool computation for a lever set, on a CPU host (the oracle the
planner's pool tests compare with).

Runs SGLang's resolution pipeline (``ServerArgs.resolve_once``) with an H200 supplied, as
``scripts/sglang-oracle.py`` does, builds the ``ModelConfig`` from the model directory's
config.json, then sizes one rank's pools with SGLang's own code:

* ``--weights-bytes N`` (the weights one rank loads): the KV budget as SGLang profiles it
  (``KVCacheConfigurator._profile_available_bytes``,
  ``sglang/srt/mem_cache/kv_cache_configurator.py:2990-3060``: free memory after the
  weights less ``(1 − mem_fraction_static)`` × the GPU and the multimodal caches), the
  GPU's free memory being its total less the weights (nothing else on a CPU host);
* ``--budget-bytes N`` instead: that budget as it is (a Mamba hybrid's KV budget after
  its state pool, which this script does not size);

then SGLang's pool configurator (``sglang/srt/model_executor/pool_configurator.py``:
``create_memory_pool_configurator``, ``calculate_pool_sizes``) and ``resolve_max_num_reqs``.
Only the parallel sizes a rank sees, the KV dtype and the runtime settings the sizing
reads are supplied by hand (no process group exists on a CPU host). Prints JSON.

    .venv-sglang/bin/python scripts/sglang-pool-oracle.py --weights-bytes N -- \\
        --model-path DIR --tp 8
    echo '[{"weights": N, "argv": ["--model-path", "DIR", "--tp", "8"]}, ...]' | \\
        .venv-sglang/bin/python scripts/sglang-pool-oracle.py --batch   # one JSON list
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def _oracle() -> Any:
    path = Path(__file__).resolve().parent / "sglang-oracle.py"
    spec = importlib.util.spec_from_file_location("sglang_oracle", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: The GPU's memory SGLang is told about (an H200's).
GPU_MIB = 143771


def _case(c: dict[str, Any]) -> tuple[dict[str, int], list[str]]:
    sizes = {k: int(c[k]) for k in ("weights", "budget") if c.get(k) is not None}
    return sizes, [str(a) for a in c["argv"]]


def main(argv: list[str]) -> int:
    if argv == ["--batch"]:
        cases = [_case(c) for c in json.load(sys.stdin)]
    else:
        split = argv.index("--")
        ours = argv[:split]
        key = "weights" if "--weights-bytes" in ours else "budget"
        value = ours[ours.index(f"--{key}-bytes") + 1]
        cases = [({key: int(value)}, argv[split + 1 :])]
    _install_h200()
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args import prepare_server_args

    out = []
    for sizes, sglang_argv in cases:
        args = prepare_server_args(sglang_argv)
        args.resolve_once()
        resolved = args.resolved_dict()
        mc = ModelConfig.from_server_args(args)
        out.append(pool(args, resolved, mc, sizes))
    print(json.dumps(out if argv == ["--batch"] else out[0]))
    return 0


def _install_h200() -> None:
    """Stub the kernel packages and report an H200 (as scripts/sglang-oracle.py does)."""
    orc = _oracle()
    import transformers.utils.import_utils as iu

    iu.is_torchvision_available()
    iu.is_torchvision_v2_available()
    iu.is_torchvision_greater_or_equal("0.27")
    sys.meta_path.append(orc._Stubs())
    logging.disable(logging.WARNING)
    import torch

    torch.cuda.is_available = lambda: True  # type: ignore[assignment]
    torch.version.cuda = "12.9"  # type: ignore[misc]
    torch.cuda.device_count = lambda: 8  # type: ignore[assignment]
    torch.cuda.get_device_capability = lambda d=None: (9, 0)  # type: ignore[assignment]
    torch.cuda.get_device_name = lambda d=None: "NVIDIA H200"  # type: ignore[assignment]
    import sglang.srt.arg_groups.memory_hook as memory_hook
    import sglang.srt.utils.common as common
    from sglang.srt.runtime_context import override_platform

    common.get_device_memory_capacity = lambda device=None: GPU_MIB
    common.get_device = lambda device_id=None: "cuda" if device_id is None else f"cuda:{device_id}"
    common.get_device_count = lambda: 8
    memory_hook.get_device_memory_capacity = lambda device=None: GPU_MIB
    override_platform(
        is_cuda=True, is_hip=False, is_npu=False, is_xpu=False, is_musa=False, is_mps=False,
        is_sm90=True, is_sm100=False, is_sm100_or_sm110=False, is_sm110=False,
        is_sm120=False, is_blackwell=False, is_hopper_with_cuda_12_3=True, has_amx=False,
        has_flashinfer=True, device_sm=90, device_capability=(9, 0),
    ).install()  # fmt: skip


#: The config namespaces of the case being sized, and SGLang's own accessors they replace.
CURRENT: dict[str, Any] = {}
ORIGINALS: dict[str, Any] = {}
#: Settings read that were not supplied (all "off"): reported with each answer.
DEFAULTED: set[str] = set()


class _Bag(SimpleNamespace):
    """A config namespace: the values given, every other setting off (None)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        DEFAULTED.add(name)
        return None


def pool(args: Any, resolved: dict[str, Any], mc: Any, sizes: dict[str, int]) -> dict[str, Any]:
    """SGLang's KV budget (from ``sizes["weights"]``, else ``sizes["budget"]``), pool
    configurator and request cap for one rank of ``args``."""
    import sglang.srt.model_executor.pool_configurator as pc
    from sglang.srt.model_executor.model_runner_components.layer_setup import (
        ModelLayerInfo,
        _resolve_local_hybrid_swa_layer_ids,
    )
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    tp = int(resolved.get("tp_size") or 1)
    attn_dp = int(resolved.get("attn_dp_size") or 1)
    page = int(resolved.get("page_size") or 1)
    parallel = _Bag(
        attn_tp_size=tp // attn_dp, attn_dcp_size=1, tp_size=tp, pp_size=1,
        attn_dp_size=attn_dp, enable_dsa_cache_layer_split=False,
    )  # fmt: skip
    parallel.launch_world_size = 1
    parallel.world_group = _Bag(cpu_group=None)
    schedule = _Bag(
        max_total_tokens=resolved.get("max_total_tokens"),
        swa_full_tokens_ratio=float(resolved.get("swa_full_tokens_ratio") or 0.8),
        page_size=page,
        max_running_requests=resolved.get("max_running_requests"),
        chunked_prefill_size=resolved.get("chunked_prefill_size"),
        mem_fraction_static=resolved.get("mem_fraction_static"),
        prefill_max_requests=None,
        max_mamba_cache_size=None,
    )
    memory = _Bag(
        enable_hisparse=False,
        enable_unified_memory=False,
        enable_unified_cache_external_linker=False,
        disable_radix_cache=bool(resolved.get("disable_radix_cache")),
    )
    kernel = _Bag(
        dsa_prefill_backend=resolved.get("dsa_prefill_backend"),
        dsa_decode_backend=resolved.get("dsa_decode_backend"),
    )
    prefill_graph = _Bag(backend=None, full_prefill_max_req=None)
    exec_ = _Bag(kernel=kernel, graph=_Bag(cuda_graph_config=_Bag(prefill=prefill_graph)))
    disagg = _Bag(disaggregation_mode=str(resolved.get("disaggregation_mode") or "null"))
    mm = _Bag(mm_feature_transport=resolved.get("mm_feature_transport"))
    import sglang.srt.layers.cp.utils  # noqa: F401  (imported lazily by the configurator)
    import sglang.srt.mem_cache.kv_cache_configurator as kcc
    import sglang.srt.runtime_context as rc

    # No process group on a CPU host: one rank's parallel sizes, schedule, memory, kernel
    # and multimodal settings are supplied to every module that reads them.
    CURRENT.update(
        get_parallel=parallel, get_schedule=schedule, get_memory=memory, get_exec=exec_,
        get_disagg=disagg, get_mm=mm,
    )  # fmt: skip
    originals = {name: ORIGINALS.setdefault(name, getattr(rc, name)) for name in CURRENT}
    for module in [m for n, m in list(sys.modules.items()) if n.startswith("sglang.")]:
        for name in CURRENT:
            if getattr(module, name, None) is originals[name]:
                setattr(module, name, lambda name=name: CURRENT[name])
    layers = range(0, mc.num_attention_layers if hasattr(mc, "num_attention_layers") else 0)
    swa_ids, full_ids = _resolve_local_hybrid_swa_layer_ids(model_config=mc, owned_layers=layers)
    info = ModelLayerInfo(
        start_layer=layers.start, end_layer=layers.stop, num_effective_layers=len(layers),
        swa_attention_layer_ids=swa_ids, full_attention_layer_ids=full_ids,
    )  # fmt: skip
    import torch
    from sglang.srt.mem_cache.kv_cache_dtype import configure_kv_cache_dtype

    # The loaded model's quant_config carries the checkpoint's kv_cache_quant_algo; the
    # loader is not run here, so it is read from config.json's quantization_config.
    quant = getattr(mc.hf_config, "quantization_config", None) or {}
    algo = quant.get("kv_cache_quant_algo") if isinstance(quant, dict) else None
    dtype_str, kv_dtype = configure_kv_cache_dtype(
        server_args_kv_cache_dtype=str(resolved.get("kv_cache_dtype") or "auto"),
        model=SimpleNamespace(quant_config=SimpleNamespace(kv_cache_quant_algo=algo)),
        model_dtype=torch.bfloat16,
        is_draft_worker=False,
        is_dflash=False,
        speculative_draft_attention_backend="",
    )
    dtype_str = dtype_str or str(resolved.get("kv_cache_dtype") or "auto")
    kvc = _Bag(
        model_config=mc, server_args=_Bag(enable_hisparse=False),
        kv_cache_dtype=kv_dtype, kv_cache_dtype_str=dtype_str, model_dtype=torch.bfloat16,
        layer_info=info, page_size=page, sliding_window_size=mc.sliding_window_size,
        spec_algorithm=SpeculativeAlgorithm.from_string("NONE"), is_draft_worker=False,
        is_hybrid_swa=mc.is_hybrid_swa, use_mla_backend=mc.attention_arch.name == "MLA",
        fused_entry_bytes=lambda kind: None, pp_size=1, attn_dp_size=attn_dp,
        kv_shard_spec=None, dflash_draft_cell_size_per_token=None,
    )  # fmt: skip
    kvc.mambaish_config = None
    kvc.post_capture_kv_active = False
    kvc.device, kvc.gpu_id = "cuda", 0
    if "weights" in sizes:
        # The GPU's free memory after loading: all of it but the weights (a CPU host has no
        # CUDA context or NCCL buffers to lose), in GiB as SGLang's reader gives it.
        free_gib = (GPU_MIB * (1 << 20) - sizes["weights"]) / (1 << 30)
        kcc.get_available_gpu_memory = lambda *a, **k: free_gib
        budget = kcc.KVCacheConfigurator._profile_available_bytes(kvc, GPU_MIB / 1024)
    else:
        budget = sizes["budget"]
    mm_reserved = kcc.mm_runtime_reservation_gb(
        is_multimodal=mc.is_multimodal, mm_feature_transport=mm.mm_feature_transport
    )
    configurator = pc.create_memory_pool_configurator(kvc)  # type: ignore[arg-type]
    config = configurator.calculate_pool_sizes(budget, page)
    kvc.attn_dp_size = attn_dp
    max_running = kcc.KVCacheConfigurator.resolve_max_num_reqs(kvc, config.max_total_num_tokens)
    return {
        "configurator": type(configurator).__name__,
        "cell_size": getattr(configurator, "_cell_size", None),
        "budget_bytes": budget,
        "max_total_num_tokens": config.max_total_num_tokens,
        "swa_max_total_num_tokens": getattr(config, "swa_max_total_num_tokens", None),
        "max_running_requests": max_running,
        "context_len": mc.context_len,
        "is_multimodal": bool(mc.is_multimodal),
        "mm_reserved_bytes": int(mm_reserved * (1 << 30)),
        "mem_fraction_static": resolved.get("mem_fraction_static"),
        "kv_cache_dtype": dtype_str,
        "page_size": page,
        "defaulted_off": sorted(DEFAULTED),
    }


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
