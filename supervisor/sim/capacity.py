"""KV-cache capacity of the simulated server, through the planner's math, resolved as
SGLang 0.5.23 resolves its arguments (``/server_info``'s values, the default
``max_running_requests``, the "HiCache auto-sizing" line), and where its memory runs out.

Memory outside the static pool (``(1 − mem_fraction_static)`` × the GPU, what
``mem_cache/kv_cache_configurator.py:3007`` leaves as slack) is spent as SGLang's own
reserve rule budgets it (``arg_groups/memory_hook.py:309-317``, ``:357-414``): attention
metadata (512 MiB), ``tp × pp / 8 × 1024`` MiB of parallel overhead (NCCL), the CUDA graphs
(``reserve_for_graph_mb``), DeepEP's buffers, and what is left is the prefill's
activations at 1.5 MiB per token (``memory_hook.py:310``). So a fraction fails where
SGLang's does: at CUDA-graph capture when the slack does not cover the fixed part, or,
after ready, on the first prefill whose tokens need more activation memory than is left
("CUDA out of memory"). There is no fixed cut-off: at SGLang's own default fraction every
prefill up to the chunk fits.

The simulated server "serves" one model and sizes its KV pool with
``sglang_supervisor.planner`` — the same functions ``POST /plan`` uses — so a plan's predicted
``max_total_num_tokens`` is exactly what the simulation reports. The model is, in order:

1. ``--model-path`` when it is a local directory with a ``config.json`` (weights from its
   ``model.safetensors.index.json`` / ``*.safetensors`` sizes, else estimated), as real
   SGLang would load it;
2. ``SGLANG_SIM_MODEL_CONFIG=<path to a config.json>`` (weights estimated from it);
3. the built-in Llama-3.1-70B-like model (80 layers, 8 KV heads of 128, 70.6e9 bf16
   parameters).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglang_supervisor import planner
from sglang_supervisor.planner import ModelSpec, PlanError
from sglang_supervisor.planner.hicache import HICACHE_HOST_MEMORY_FRACTION, auto_sized
from sglang_supervisor.sglang.layout import Layout
from sglang_supervisor.sim.load import LOAD_ENV, Engine, parse_load
from sglang_supervisor.units import GiB, MiB

if TYPE_CHECKING:
    from sglang_supervisor.sim.flags import SimEnv

#: The simulated host's available RAM (GiB) for the hierarchical cache's auto-sizing.
HOST_RAM_ENV = "SGLANG_SIM_HOST_RAM_GIB"
#: The parts of SGLang's reserve that are spent before the first prefill: attention
#: metadata, the parallel (NCCL) overhead, the graphs, DeepEP's buffers.
FIXED_RESERVE_PARTS = (
    "metadata",
    "parallel",
    "decode_graphs",
    "dp_attention",
    "prefill_graphs",
    "deepep_prefill",
    "deepep_a2a",
)
#: Activation memory of one prefill token (``memory_hook.py:310``: activation_tokens × 1.5).
ACTIVATION_MIB_PER_TOKEN = 1.5

MODEL_CONFIG_ENV = "SGLANG_SIM_MODEL_CONFIG"

#: The built-in simulated model: Llama-3.1-70B's public config.json values.
SIM_MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
#: Its weights: 70.6e9 parameters × 2 bytes (bf16).
SIM_MODEL_WEIGHT_BYTES = 141_200_000_000

SIM_MODEL: ModelSpec = planner.model_from_config(
    SIM_MODEL_CONFIG,
    name="simulated Llama-3.1-70B",
    source="the simulated server's built-in model",
    weight_bytes=SIM_MODEL_WEIGHT_BYTES,
    weight_source="the simulated model: 70.6e9 bf16 parameters",
)


def resolve_model(model_path: str, env: Mapping[str, str]) -> ModelSpec:
    """The model the simulated server serves (see the module docstring for the order).

    Raises ``PlanError`` when ``SGLANG_SIM_MODEL_CONFIG`` or the model directory's
    config.json cannot be read or is not a transformer config.
    """
    path = Path(model_path).expanduser()
    if (path / "config.json").is_file():
        return planner.load_model_dir(path)
    configured = env.get(MODEL_CONFIG_ENV, "").strip()
    if configured:
        config_path = Path(configured).expanduser()
        config = planner.read_config(config_path)
        try:
            return planner.model_from_config(
                config, name=config_path.parent.name or model_path, source=str(config_path)
            )
        except PlanError as exc:
            raise PlanError(f"{MODEL_CONFIG_ENV}={configured}: {exc}") from exc
    return SIM_MODEL


def cell_bytes(model: ModelSpec, tp_size: int, kv_cache_dtype: str | None, pp_size: int = 1) -> int:
    """KV bytes one token takes on one rank (``sglang_supervisor.planner.cell_bytes``)."""
    return planner.cell_bytes(model.shape, tp_size, kv_cache_dtype, pp_size)


def weight_bytes_per_rank(model: ModelSpec, tp_size: int, pp_size: int = 1) -> int:
    """The model's weights split evenly over ``tp_size × pp_size`` ranks."""
    return planner.weight_bytes_per_rank(model, tp_size, pp_size)


def kv_tokens(
    total_bytes: int, mem_fraction: float, weight_bytes_per_rank: int, cell_bytes: int
) -> int:
    """``(mem_fraction × total − weights) // cell``, floored at 0 (``planner.kv_tokens``)."""
    return planner.kv_tokens(total_bytes, mem_fraction, weight_bytes_per_rank, cell_bytes)


def resolve_avg_tokens(env: Mapping[str, str]) -> tuple[int, str] | None:
    """The average request length of the simulated load in ``env`` (None: no load)."""
    text = env.get(LOAD_ENV)
    if not text:
        return None
    try:
        load = parse_load(text)
    except ValueError:
        return None
    if load is None:
        return None
    return load.avg_tokens, f"the simulated load ({LOAD_ENV})"


@dataclass(frozen=True)
class Resolved:
    """What the simulated server resolves at start, as SGLang would (one rank's view)."""

    capacity: planner.Capacity
    mem_fraction_static: float
    #: Bytes per token (float for sliding-window hybrids).
    cell_bytes: float
    weight_bytes_per_rank: int
    max_total_num_tokens: int
    #: SGLang's max_running_requests over the server, and per DP worker.
    max_running_requests: int
    max_running_requests_per_worker: int
    host_pool_tokens: int
    #: The hicache_ratio in effect (auto-sized when neither size nor ratio was given).
    hicache_ratio: float | None
    #: SGLang's log line when it auto-sizes the host pool.
    hicache_log: str | None
    decode_graph_max_bs: int | None
    #: MiB spent outside the static pool before the first prefill (SGLang's reserve less
    #: its activation part): the CUDA-graph capture fails when the slack is smaller.
    capture_need_mib: float
    #: Most tokens one prefill forward takes (the chunk per DP worker; with chunking off
    #: SGLang's ``max_prefill_tokens``).
    prefill_batch_tokens: int

    def server_info(self) -> dict[str, Any]:
        """The resolved values ``/server_info`` reports (SGLang's ``resolved_dict``)."""
        c = self.capacity
        return {
            "mem_fraction_static": self.mem_fraction_static,
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_running_requests": self.max_running_requests,
            "chunked_prefill_size": c.chunked_prefill_size,
            "schedule_conservativeness": c.schedule_conservativeness,
            "attn_dp_size": c.attn_dp_size,
            "enable_dp_attention": c.attn_dp_size > 1,
            "dp_size": c.replicas,
            "kv_cache_dtype": c.kv_cache_dtype,
            "cuda_graph_max_bs_decode": self.decode_graph_max_bs,
            "hicache_ratio": self.hicache_ratio,
        }


def host_ram_bytes(env: Mapping[str, str]) -> int:
    """The simulated host's available RAM: ``SGLANG_SIM_HOST_RAM_GIB``, else this host's."""
    text = env.get(HOST_RAM_ENV, "").strip()
    if text:
        try:
            return int(float(text) * GiB)
        except ValueError:
            pass
    return planner.hicache.available_host_ram_bytes()[0]


def resolve(
    model: ModelSpec, args: Mapping[str, Any], gpu_bytes: int, env: Mapping[str, str] | None = None
) -> Resolved:
    """The simulated server's resolved values for its parsed flags ``args``."""
    env = os.environ if env is None else env
    host = host_ram_bytes(env) if auto_sized(args) else None
    cap = planner.capacity(model, args, gpu_bytes, 4096, host)
    reserve = planner.sglang_reserve(gpu_bytes, args, model.shape)
    capture = sum(reserve.parts_mib.get(k, 0.0) for k in FIXED_RESERVE_PARTS)
    ratio = planner.lever_float(args, "hicache_ratio")
    log_line = None
    if cap.hierarchical_cache and auto_sized(args) and host is not None:
        ratio = cap.host_pool_tokens_per_rank / max(1, cap.kv_tokens_per_rank)
        ranks = Layout.of(args).ranks
        budget = (host - planner.SGLANG_HOST_RAM_MARGIN) // max(1, ranks)
        budget = int(budget * HICACHE_HOST_MEMORY_FRACTION)
        log_line = (
            f"HiCache auto-sizing: ratio {planner.DEFAULT_HICACHE_RATIO:.3f} -> {ratio:.3f}; "
            f"{budget / GiB:.1f} GiB host memory per rank (fraction "
            f"{HICACHE_HOST_MEMORY_FRACTION:.2f}, {ranks} ranks on this host), host pools "
            f"{cap.host_pool_tokens_per_rank * cap.cell_bytes_exact / GiB:.1f} GiB."
        )
    elif cap.hierarchical_cache and ratio is None and not planner.lever_int(args, "hicache_size"):
        ratio = planner.DEFAULT_HICACHE_RATIO
    return Resolved(
        capacity=cap,
        mem_fraction_static=cap.mem_fraction_static,
        cell_bytes=cap.cell_bytes_exact,
        weight_bytes_per_rank=cap.weight_bytes_per_rank,
        max_total_num_tokens=cap.kv_tokens_per_rank,
        max_running_requests=cap.max_running_requests,
        max_running_requests_per_worker=cap.max_running_requests_per_worker,
        host_pool_tokens=cap.host_pool_tokens_per_rank,
        hicache_ratio=None if ratio is None else round(ratio, 3),
        hicache_log=log_line,
        decode_graph_max_bs=cap.cuda_graph_max_bs_decode,
        capture_need_mib=capture,
        prefill_batch_tokens=cap.chunked_prefill_size
        if cap.chunked_prefill_size > 0
        else reserve.activation_tokens,
    )


def slack_mib(resolved: Resolved, gpu_bytes: int) -> float:
    """MiB outside the static pool: ``(1 − mem_fraction_static)`` × the GPU."""
    return (1 - resolved.mem_fraction_static) * gpu_bytes / MiB


def capture_failure(resolved: Resolved, gpu_bytes: int) -> list[str] | None:
    """SGLang's CUDA-graph capture OOM when the slack outside the static pool is smaller
    than the metadata, the parallel overhead and the graphs need; None when it fits."""
    free_mib = slack_mib(resolved, gpu_bytes)
    if free_mib >= resolved.capture_need_mib:
        return None
    total_gib = gpu_bytes / GiB
    return [
        "Capture cuda graph begin. This can take up to several minutes.",
        "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate "
        f"{(resolved.capture_need_mib - free_mib) / 1024:.2f} GiB. GPU 0 has a total capacity "
        f"of {total_gib:.2f} GiB of which {free_mib / 1024:.2f} GiB is free.",
        f"Possible solutions: 1. set --mem-fraction-static to a smaller value (e.g., "
        f"{resolved.capacity.sglang_default_fraction}, SGLang's default for these flags); "
        "2. set --cuda-graph-max-bs-decode to a smaller value; 3. disable CUDA graphs by "
        "--disable-cuda-graph.",
    ]


def prefill_limit_tokens(resolved: Resolved, gpu_bytes: int) -> int:
    """The most tokens one prefill forward can take before its activations run out of
    memory: what the slack leaves after the fixed part, at 1.5 MiB per token.

    SGLang rounds its default fraction to 3 decimals, which can leave up to 0.0005 × the
    GPU less than its rule; that half step is granted, so at SGLang's own default a full
    chunk always fits.
    """
    rounding = 0.0005 * gpu_bytes / MiB
    left = slack_mib(resolved, gpu_bytes) - resolved.capture_need_mib + rounding
    return max(0, int(left / ACTIVATION_MIB_PER_TOKEN))


def prefill_oom_report(resolved: Resolved, gpu_bytes: int, tokens: int) -> list[str]:
    """The scheduler's traceback when a prefill of ``tokens`` tokens runs out of memory."""
    total_gib = gpu_bytes / GiB
    left_mib = max(0.0, slack_mib(resolved, gpu_bytes) - resolved.capture_need_mib)
    need_gib = tokens * ACTIVATION_MIB_PER_TOKEN / 1024
    limit = prefill_limit_tokens(resolved, gpu_bytes)
    return [
        "Scheduler hit an exception: Traceback (most recent call last):",
        '  File "sglang/srt/managers/scheduler.py", in event_loop_overlap',
        "    batch_result = self.run_batch(batch)",
        '  File "sglang/srt/model_executor/model_runner.py", in forward_extend',
        "    return self.model.forward(forward_batch.input_ids, forward_batch.positions, ...)",
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need_gib:.2f} GiB. "
        f"GPU 0 has a total capacity of {total_gib:.2f} GiB of which {left_mib / 1024:.2f} "
        "GiB is free. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
        f"(simulated: a prefill of {tokens} tokens needs {need_gib:.2f} GiB of activations "
        f"at 1.5 MiB per token; mem_fraction_static={resolved.mem_fraction_static:g} leaves "
        f"room for {limit} after the CUDA graphs; SGLang's default for these flags is "
        f"{resolved.capacity.sglang_default_fraction})",
    ]


def engine_for(resolved: Resolved, env: SimEnv, total_bytes: int, cuda_graph: bool) -> Engine:
    """The simulated server's load engine for its resolved flags: one scheduler per DP
    worker, each with its own pool of ``max_total_num_tokens`` and its share of
    ``max_running_requests`` (SGLang's rule, the lever's value when given)."""
    return Engine(
        resolved.max_total_num_tokens,
        max(1, resolved.max_running_requests_per_worker),
        workers=resolved.capacity.kv_pools,
        host_cache_tokens=resolved.host_pool_tokens,
        decode_graph_max_bs=resolved.decode_graph_max_bs if cuda_graph else None,
        load=env.load,
        tokens_per_s=env.tokens_per_s,
        prefill_batch_tokens=resolved.prefill_batch_tokens,
        prefill_limit_tokens=prefill_limit_tokens(resolved, total_bytes),
        prefill_tokens_per_s=env.prefill_tokens_per_s,
        schedule_conservativeness=resolved.capacity.schedule_conservativeness,
    )
