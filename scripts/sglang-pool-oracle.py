"""SGLang 0.5.23's own KV pool computation for a lever set, on a CPU host (the oracle the
planner's pool tests compare with).

Runs SGLang's resolution pipeline (``ServerArgs.resolve_once``) with an H200 supplied, as
``scripts/sglang-oracle.py`` does, builds the ``ModelConfig`` from the model directory's
config.json, then asks SGLang's pool configurator
(``sglang/srt/model_executor/pool_configurator.py``: ``create_memory_pool_configurator``,
``calculate_pool_sizes``) how many tokens a KV budget of ``--budget-bytes`` holds on one
rank. Only the parallel sizes a rank sees and the KV dtype are supplied by hand (no
process group exists on a CPU host). Prints JSON.

    .venv-sglang/bin/python scripts/sglang-pool-oracle.py --budget-bytes N -- \\
        --model-path DIR --tp 8
    echo '[{"budget": N, "argv": ["--model-path", "DIR", "--tp", "8"]}, ...]' | \\
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


def main(argv: list[str]) -> int:
    if argv == ["--batch"]:
        cases = [(int(c["budget"]), [str(a) for a in c["argv"]]) for c in json.load(sys.stdin)]
    else:
        split = argv.index("--")
        ours = argv[:split]
        cases = [(int(ours[ours.index("--budget-bytes") + 1]), argv[split + 1 :])]
    _install_h200()
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args import prepare_server_args

    out = []
    for budget, sglang_argv in cases:
        args = prepare_server_args(sglang_argv)
        args.resolve_once()
        resolved = args.resolved_dict()
        mc = ModelConfig.from_server_args(args)
        out.append(pool(args, resolved, mc, budget))
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

    common.get_device_memory_capacity = lambda device=None: 143771
    common.get_device = lambda device_id=None: "cuda" if device_id is None else f"cuda:{device_id}"
    common.get_device_count = lambda: 8
    memory_hook.get_device_memory_capacity = lambda device=None: 143771
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


def pool(args: Any, resolved: dict[str, Any], mc: Any, budget: int) -> dict[str, Any]:
    """SGLang's pool configurator on ``budget`` bytes for one rank of ``args``."""
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
    schedule = _Bag(
        max_total_tokens=resolved.get("max_total_tokens"),
        swa_full_tokens_ratio=float(resolved.get("swa_full_tokens_ratio") or 0.8),
        page_size=page,
        max_running_requests=resolved.get("max_running_requests"),
        chunked_prefill_size=resolved.get("chunked_prefill_size"),
    )
    memory = _Bag(
        enable_hisparse=False,
        enable_unified_memory=False,
        disable_radix_cache=bool(resolved.get("disable_radix_cache")),
    )
    import sglang.srt.layers.cp.utils  # noqa: F401  (imported lazily by the configurator)
    import sglang.srt.runtime_context as rc

    # No process group on a CPU host: one rank's parallel sizes, schedule and memory
    # settings are supplied to every module that reads them.
    CURRENT.update(get_parallel=parallel, get_schedule=schedule, get_memory=memory)
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
    configurator = pc.create_memory_pool_configurator(kvc)  # type: ignore[arg-type]
    config = configurator.calculate_pool_sizes(budget, page)
    return {
        "configurator": type(configurator).__name__,
        "cell_size": getattr(configurator, "_cell_size", None),
        "max_total_num_tokens": config.max_total_num_tokens,
        "swa_max_total_num_tokens": getattr(config, "swa_max_total_num_tokens", None),
        "context_len": mc.context_len,
        "mem_fraction_static": resolved.get("mem_fraction_static"),
        "page_size": page,
        "defaulted_off": sorted(DEFAULTED),
    }


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
