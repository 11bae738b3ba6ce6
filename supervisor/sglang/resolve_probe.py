"""SGLang's own launch-time validation, run *inside the server's interpreter*.

The supervisor runs this source with ``python -c`` (so ``sys.path[0]`` is the server's
working directory, as for ``python -m sglang.launch_server``, never this file's folder),
in the server's environment and working directory. It imports nothing but the standard
library, torch and SGLang. One program with ``probe_checks.py`` (the checks before
SGLang's resolution) and ``probe_serve.py`` (the warm ``--serve`` mode):
``sglang_supervisor.sglang.resolution_helper.probe_source`` joins them.

Input (stdin, JSON): ``{"argv": [...], "gpu": {"count", "name", "capability": [major,
minor], "memory_mib", "driver_version"}}``.

What it runs, in the order ``sglang.launch_server`` does (SGLang 0.5.23):
``load_plugins()``, ``prepare_server_args(argv)`` (argparse), ``resolve_once()`` (the
resolution pipeline: every ``handle_*`` hook of ``sglang/srt/arg_groups/pipeline.py``)
and ``check_server_args()`` (``arg_groups/validation_hook.py``). The hardware facts SGLang
would read from CUDA (device count, name, compute capability, memory per GPU, driver
version) are answered from ``gpu`` by patching only the device functions in this process;
anything that would really initialise CUDA raises instead, so the probe never creates a
context on a GPU the running server uses. The model's config is read offline
(``HF_HUB_OFFLINE=1``): nothing is downloaded.

Output (stdout, JSON): ``{"ok", "stage": "parse"|"resolve"|"check"|null, "message",
"where": "sglang/...py:LINE in func", "error_type", "resolved": {...}, "not_run": [...],
"sglang_version", "timings": {...}}``. A refusal is an exception SGLang's own code raised
(ValueError, AssertionError, NotImplementedError, RuntimeError, argparse's error); an
exception that comes from what this host lacks (the model's config, a kernel module, a
GPU) is reported in ``not_run`` and never as a refusal.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import time
import traceback
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time these come in the same -c program (probe_source)
    from sglang_supervisor.sglang.probe_checks import check_paths, model_unreachable
    from sglang_supervisor.sglang.probe_serve import serve
    from sglang_supervisor.sglang.probe_standins import code_names, not_run_item, with_standins

#: Resolved fields the supervisor shows (the full diff against the input comes too).
KEY_FIELDS = (
    "mem_fraction_static",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "max_running_requests",
    "max_total_tokens",
    "page_size",
    "attention_backend",
    "prefill_attention_backend",
    "decode_attention_backend",
    "sampling_backend",
    "kv_cache_dtype",
    "dsa_prefill_backend",
    "dsa_decode_backend",
    "tp_size",
    "pp_size",
    "dp_size",
    "attn_dp_size",
    "ep_size",
    "schedule_policy",
    "disable_radix_cache",
    "enable_hierarchical_cache",
    "hicache_ratio",
    "hicache_size",
    "hicache_write_policy",
    "speculative_algorithm",
)
_REFUSALS = (ValueError, AssertionError, NotImplementedError, RuntimeError)


class NeedsGpu(RuntimeError):
    """Raised where SGLang would initialise CUDA: only start-up can answer that."""


def _no_cuda(name: str) -> Any:
    # One function object per name: torch._dynamo refuses one object under two names.
    def refuse(*_a: Any, **_k: Any) -> Any:
        raise NeedsGpu(f"torch.cuda.{name}: the probe never initialises CUDA")

    return refuse


def install_device_facts(gpu: dict[str, Any]) -> list[str]:
    """Answer SGLang's hardware questions from ``gpu`` (NVML of the managed GPUs).

    Patches torch.cuda's device queries and SGLang's own NVML/nvidia-smi readers; the
    lru-cached platform probes of ``sglang.srt.utils.common`` then compute from these.
    Returns notes on facts that had to be assumed.
    """
    import torch

    notes: list[str] = []
    count = int(gpu["count"])
    name = str(gpu["name"])
    major, minor = (int(x) for x in gpu["capability"])
    mib = int(gpu["memory_mib"])
    props = types.SimpleNamespace(
        name=name,
        major=major,
        minor=minor,
        total_memory=mib << 20,
        multi_processor_count=int(gpu.get("sm_count") or 132),
        is_integrated=False,
        uuid=None,
    )
    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.is_initialized = lambda: True
    cuda.device_count = lambda: count
    cuda.get_device_capability = lambda device=None: (major, minor)
    cuda.get_device_name = lambda device=None: name
    cuda.get_device_properties = lambda device=None: props
    # The new server starts on released GPUs: all of their memory is free then.
    cuda.mem_get_info = lambda device=None: (mib << 20, mib << 20)
    cuda.current_device = lambda: 0
    for guarded in ("_lazy_init", "init", "set_device", "synchronize"):
        setattr(cuda, guarded, _no_cuda(guarded))
    if torch.version.cuda is None:  # a CPU build of torch (the test environment)
        torch.version.cuda = "13.0"
        notes.append("torch here is a CPU build: CUDA 13.0 assumed for version checks")

    from sglang.srt.utils import common

    def driver() -> str | None:
        return gpu.get("driver_version")

    common.get_nvgpu_memory_capacity = lambda: float(mib)
    common.get_nvidia_driver_version_str = driver
    common._get_device_sm_via_nvml = lambda: major * 10 + minor
    common.is_mnnvl_fabric_device = lambda: any(t in name.upper() for t in ("GB200", "GB300"))
    # Modules that bound these names at import see the same answers.
    patched = {
        "get_nvgpu_memory_capacity": common.get_nvgpu_memory_capacity,
        "get_nvidia_driver_version_str": driver,
        "is_mnnvl_fabric_device": common.is_mnnvl_fabric_device,
    }
    for mod in list(sys.modules.values()):
        if mod is None or not getattr(mod, "__name__", "").startswith("sglang."):
            continue
        for attr, fn in patched.items():
            if attr in vars(mod):
                setattr(mod, attr, fn)
    return notes


#: Libraries SGLang asks for facts: an exception raised inside them is about what this
#: host lacks (a model file, a device), not a refusal of the levers.
_LIBRARIES = ("/torch/", "/transformers/", "/huggingface_hub/", "/triton/", "sglang_test_stubs")


def _where(exc: BaseException) -> tuple[str | None, bool]:
    """Where ``exc`` was raised ("sglang/...py:LINE in func", or a plugin's file) and
    whether it is a verdict of SGLang's launch code: raised by SGLang itself or by a
    plugin hooked into its resolution, not inside a library SGLang called for facts."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None, False
    paths = [f.filename.replace(os.sep, "/") for f in frames]
    through_sglang = any("/sglang/" in p for p in paths)
    inner, path = frames[-1], paths[-1]
    shown = "sglang/" + path.rsplit("/sglang/", 1)[1] if "/sglang/" in path else path
    own = through_sglang and not any(lib in path for lib in _LIBRARIES)
    return f"{shown}:{inner.lineno} in {inner.name}", own


def _jsonable(value: Any, depth: int = 0) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if depth > 6:
        return repr(value)[:200]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    return repr(value)[:200]


def _resolved(args: Any) -> dict[str, Any]:
    full = args.resolved_dict()
    raw = getattr(args, "_raw_input", {}) or {}
    out = {k: _jsonable(full.get(k)) for k in KEY_FIELDS if k in full}
    graph = full.get("cuda_graph_config") or {}
    decode = graph.get("decode") if isinstance(graph, dict) else None
    if isinstance(decode, dict):
        out["cuda_graph_max_bs"] = decode.get("max_bs")
        out["cuda_graph_bs"] = _jsonable(decode.get("bs"))
        out["cuda_graph_backend"] = decode.get("backend")
    changed = {
        k: _jsonable(v)
        for k, v in full.items()
        if not k.startswith("_") and k in raw and raw[k] != v and k != "random_seed"
    }
    changed.pop("cuda_graph_config", None)
    out["changed_by_resolution"] = sorted(changed)
    return out


def _stages(args: Any, out: dict[str, Any]) -> dict[str, Any] | None:
    """SGLang's resolution, then check_server_args, on ``args``: the refusal (a dict of
    stage, message, where, error_type) or None; what could not run goes to
    ``out["not_run"]``."""
    timings = out["timings"]
    for stage, step in (("resolve", args.resolve_once), ("check", args.check_server_args)):
        t = time.monotonic()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                step()
        except Exception as exc:
            where, own = _where(exc)
            message = str(exc) or type(exc).__name__
            timings[f"{stage}_s"] = time.monotonic() - t
            after = f"SGLang's {stage} from {where or 'its start'} on"
            if isinstance(exc, (NeedsGpu, ImportError)):
                missing = getattr(exc, "name", None)
                why = (
                    "needs a GPU"
                    if isinstance(exc, NeedsGpu)
                    else f"needs the module {missing!r} (not installed in this environment)"
                    if missing
                    else f"needs {exc}"
                )
                out["not_run"].append(not_run_item(after, f"{why}; only start-up can check it"))
            elif isinstance(exc, _REFUSALS) and own:
                return {
                    "stage": stage,
                    "message": message,
                    "where": where,
                    "error_type": type(exc).__name__,
                    "code_names": code_names(exc),
                }
            else:
                out["not_run"].append(
                    not_run_item(after, f"SGLang stopped with {type(exc).__name__}: {message}")
                )
            return None
        timings[f"{stage}_s"] = time.monotonic() - t
    return None


def run(
    argv: list[str], gpu: dict[str, Any], paths: dict[str, str] | None = None
) -> dict[str, Any]:
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    out: dict[str, Any] = {
        "ok": True,
        "stage": None,
        "message": None,
        "where": None,
        "error_type": None,
        "resolved": {},
        "problems": [],
        "not_run": [],
        "notes": [],
        "timings": timings,
    }
    out["notes"] = install_device_facts(gpu)
    import sglang

    out["sglang_version"] = getattr(sglang, "__version__", None)
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    timings["import_s"] = time.monotonic() - t0
    load_plugins()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = prepare_server_args(argv)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if ": error: " in ln]
        message = lines[-1].split(": error: ", 1)[1] if lines else err.getvalue().strip()
        return {**out, "ok": False, "stage": "parse", "message": message}
    except Exception as exc:
        where, _ = _where(exc)
        return {
            **out,
            "ok": False,
            "stage": "parse",
            "message": str(exc) or type(exc).__name__,
            "where": where,
            "error_type": type(exc).__name__,
        }
    timings["parse_s"] = time.monotonic() - t0 - timings["import_s"]
    problems = check_paths(args, paths or {})
    if problems:
        return {
            **out,
            "ok": False,
            "stage": "paths",
            "message": problems[0]["message"],
            "problems": problems,
        }
    logging.disable(logging.WARNING)
    model = str(args.model_path)
    missing_model = model_unreachable(model)
    if missing_model is None:
        refusal = _stages(args, out)
    else:
        refusal = with_standins(argv, model, missing_model, out)
    if refusal is not None:
        return {**out, "ok": False, **refusal}
    if missing_model is None and not out["not_run"]:
        out["resolved"] = _resolved(args)
    out["not_run"].append(
        not_run_item(
            "start-up only: weights on the GPUs, KV pool size (hence max_running_requests "
            "when unset), kernel builds and CUDA-graph capture, kernel package versions",
            "needs the GPUs and the weights: only the server's start-up can check it",
        )
    )
    return out


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    try:
        paths = request.get("paths") or {}
        return run([str(a) for a in request["argv"]], request["gpu"], dict(paths))
    except Exception as exc:  # SGLang or torch failing at import: not a verdict
        return {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}


def main() -> int:
    if "--serve" in sys.argv[1:]:
        return serve()
    request = json.load(sys.stdin)
    result = _answer(request)
    sys.stdout.write("\n@@RESOLVE@@" + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
