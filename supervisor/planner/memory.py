"""SGLang 0.5.23's memory rule: the reserve outside ``mem_fraction_static`` and the
default fraction it implies (``arg_groups/memory_hook.py``; paths under ``sglang/srt/``),
lowered for a vision tower (``planner.multimodal``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sglang_supervisor.planner.inputs import deepep, lever_bool, lever_float, lever_int, parse_count
from sglang_supervisor.planner.model import MiB, ModelShape
from sglang_supervisor.sglang.layout import Layout

#: SGLang's floor on activation tokens, and the smallest chunk the planner proposes.
MIN_ACTIVATION_TOKENS = 2048
#: SGLang's reserve floor on GPUs over 60 GiB.
RESERVE_FLOOR_MIB = 10 * 1024
LARGE_GPU_MIB = 60 * 1024


def sglang_default_chunked_prefill(gpu_mib: float) -> int:
    """SGLang 0.5.23's ``chunked_prefill_size`` default by GPU memory (MiB)."""
    if gpu_mib < 20 * 1024:
        return 2048
    if gpu_mib < 60 * 1024:
        return 4096
    if gpu_mib < 160 * 1024:
        return 8192
    return 16384


def sglang_default_decode_max_bs(gpu_mib: float, tp_size: int) -> int:
    """SGLang 0.5.23's decode CUDA-graph max batch size by GPU memory (MiB) and TP."""
    if gpu_mib < 20 * 1024:
        return 8
    if gpu_mib < 35 * 1024:
        return 48 if tp_size < 4 else 160
    if gpu_mib < 60 * 1024:
        return 32 if tp_size < 4 else 160
    if gpu_mib < 160 * 1024:
        return 256 if tp_size < 4 else 512
    return 512


def prefill_graph_sizes(max_bs: int) -> list[int]:
    """The token counts SGLang captures prefill graphs for, up to ``max_bs``."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_bs + 1, 512))
    )
    return [s for s in sizes if s <= max_bs]


def prefill_graph_count(max_bs: int) -> int:
    """``len(prefill_graph_sizes(max_bs))`` without building the list: ``max_bs`` comes
    from a lever (``cuda_graph_max_bs_prefill``, ``chunked_prefill_size``) and may be huge."""
    small = prefill_graph_sizes(min(max_bs, 4096))
    return len(small) + len(range(4608, max_bs + 1, 512))


def decode_graph_sizes(max_bs: int) -> list[int]:
    """The batch sizes SGLang captures decode graphs for, up to ``max_bs``."""
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    out = [s for s in sizes if s <= max_bs]
    if max_bs not in out:
        out.append(max_bs)
    return out


def round_up_graph_bs(n: int) -> int:
    """The smallest default capture size ≥ ``n`` (so the whole batch replays a graph)."""
    if n > 1024 + 32:
        return n  # decode_graph_sizes(n) ends with n itself; never list up to a huge n
    for size in decode_graph_sizes(max(n, 1024 + 32)):
        if size >= n:
            return size
    return n


@dataclass(frozen=True)
class Reserve:
    """SGLang's memory reserve (MiB) outside ``mem_fraction_static`` for one lever set."""

    gpu_mib: float
    chunked_prefill_size: int
    activation_tokens: int
    decode_graph_max_bs: int | None
    parts_mib: dict[str, float]
    floor_mib: float
    total_mib: float
    #: What SGLang multiplies its default by for a vision tower (1.0: not a VLM here).
    vlm_factor: float = 1.0

    @property
    def fraction(self) -> float:
        """``(total − reserved) / total``, unrounded (before the vision tower's cut)."""
        return (self.gpu_mib - self.total_mib) / self.gpu_mib

    @property
    def sglang_default_fraction(self) -> float:
        """What SGLang itself picks when ``mem_fraction_static`` is unset: rounded to 3
        decimals, then × the vision tower's factor, not rounded again
        (``memory_hook.py:322-336``)."""
        if self.vlm_factor == 1.0:
            return round(self.fraction, 3)
        return round(self.fraction, 3) * self.vlm_factor

    @property
    def safe_fraction(self) -> float:
        """The highest fraction within the reserve (and the vision tower's cut), floored
        to 3 decimals."""
        return math.floor(self.fraction * self.vlm_factor * 1000) / 1000

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {
            "safe_fraction": self.safe_fraction,
            "sglang_default_fraction": self.sglang_default_fraction,
        }


#: MoE all-to-all backends breakable prefill graphs are validated with
#: (``arg_groups/cuda_graph_hook.py:220-227``).
PREFILL_GRAPH_A2A = ("none", "deepep", "megamoe", "flashinfer")


def prefill_graphs_on(levers: Mapping[str, Any], shape: ModelShape | None = None) -> bool:
    """Prefill CUDA graphs: breakable by default on CUDA, off by default with PP
    (``arg_groups/cuda_graph_hook.py:150-161``) and where breakable capture is
    incompatible (``:170-249``: decode context parallelism, two-batch overlap, an
    unvalidated all-to-all backend, a multimodal model SGLang has not validated), off
    when disabled by a lever."""
    backend = levers.get("cuda_graph_backend_prefill")
    if lever_bool(levers, "disable_cuda_graph") or lever_bool(levers, "disable_prefill_cuda_graph"):
        return False
    if backend is not None:
        return str(backend) != "disabled"
    if Layout.of(levers).pp_size != 1:
        return False
    a2a = str(levers.get("moe_a2a_backend") or "none").lower()
    if (lever_int(levers, "dcp_size") or 1) > 1 or lever_bool(levers, "enable_two_batch_overlap"):
        return False
    if a2a not in PREFILL_GRAPH_A2A:
        return False
    mm = shape.multimodal if shape is not None else None
    return mm is None or mm.prefill_graphs(levers)


def decode_graphs_on(levers: Mapping[str, Any]) -> bool:
    return not (
        lever_bool(levers, "disable_cuda_graph")
        or lever_bool(levers, "disable_decode_cuda_graph")
        or str(levers.get("cuda_graph_backend_decode")) == "disabled"
    )


def sglang_reserve(gpu_bytes: int, levers: Mapping[str, Any], shape: ModelShape) -> Reserve:
    """SGLang 0.5.23's reserved memory for ``levers`` and the model ``shape``
    (``arg_groups/memory_hook.py``).

    reserved (MiB) = 512 (attention metadata) + max(chunked_prefill_size, 2048) × 1.5
    (activations; ``max_prefill_tokens`` when chunking is off; the chunk *before* the
    attention-DP division, which runs later) + tp × pp / 8 × 1024 + decode graph max batch
    × 2 + with attention DP max batch × attn_dp × 3 (× 4.5 above batch 300) + prefill
    graphs (8 MiB per captured size; 1536 MiB flat for MLA; +1024 with DeepEP and
    breakable graphs), at least 10 GiB on GPUs over 60 GiB, then + 2048 for DeepEP's
    all-to-all buffers (``:291-317``, ``reserve_for_graph_mb`` ``:357-399``,
    ``reserve_for_deepep_a2a_mb`` ``:402-414``); a vision tower then lowers the default
    fraction (``vlm_factor``, ``planner.multimodal``). Assumed: CUDA, no PD
    disaggregation, post-capture KV sizing off.
    """
    is_mla = shape.is_mla
    gpu_mib = gpu_bytes / MiB
    lay = Layout.of(levers)
    tp, pp = lay.tp_size, lay.pp_size
    chunk = lever_int(levers, "chunked_prefill_size")
    if chunk is None:
        chunk = sglang_default_chunked_prefill(gpu_mib)
    if chunk > 0:
        activation = max(chunk, MIN_ACTIVATION_TOKENS)
    else:
        activation = max(
            parse_count(levers.get("max_prefill_tokens")) or 16384, MIN_ACTIVATION_TOKENS
        )
    decode_on = decode_graphs_on(levers)
    prefill_on = prefill_graphs_on(levers, shape)
    max_bs = decode_max_bs(gpu_bytes, levers)
    attn_dp = lay.attn_dp_size
    dp_attention = 0.0
    if attn_dp > 1:
        dp_attention = max_bs * attn_dp * 3 + (max_bs * attn_dp * 1.5 if max_bs > 300 else 0)
    parts: dict[str, float] = {
        "metadata": 512.0,
        "activations": activation * 1.5,
        "parallel": tp * pp / 8 * 1024,
        "decode_graphs": float(max_bs * 2) if decode_on else 0.0,
        "dp_attention": float(dp_attention),
        "prefill_graphs": 0.0,
        "deepep_prefill": 0.0,
    }
    if prefill_on:
        if is_mla:
            parts["prefill_graphs"] = 1536.0
        else:
            prefill_bs = lever_int(levers, "cuda_graph_max_bs_prefill") or chunk
            cap = parse_count(levers.get("max_total_tokens"))
            if cap is not None:
                prefill_bs = min(prefill_bs, cap)
            parts["prefill_graphs"] = prefill_graph_count(prefill_bs) * 8.0
        breakable = str(levers.get("cuda_graph_backend_prefill") or "breakable") == "breakable"
        if breakable and deepep(levers):
            parts["deepep_prefill"] = 1024.0
    raw = sum(parts.values())
    floor = RESERVE_FLOOR_MIB if gpu_mib > LARGE_GPU_MIB else 0.0
    after_floor = 2048.0 if decode_on and deepep(levers) else 0.0
    return Reserve(
        gpu_mib=gpu_mib,
        chunked_prefill_size=chunk,
        activation_tokens=activation,
        decode_graph_max_bs=max_bs if decode_on else None,
        parts_mib=parts | {"deepep_a2a": after_floor},
        floor_mib=floor,
        total_mib=max(raw, floor) + after_floor,
        vlm_factor=1.0 if shape.multimodal is None else shape.multimodal.vlm_factor(levers),
    )


def decode_max_bs(gpu_bytes: int, levers: Mapping[str, Any]) -> int:
    """The decode CUDA-graph max batch: the lever, else SGLang's default (capped at
    ``max_running_requests`` when that is set, as SGLang does)."""
    explicit = lever_int(levers, "cuda_graph_max_bs_decode")
    if explicit is not None and explicit > 0:
        return explicit
    default = sglang_default_decode_max_bs(gpu_bytes / MiB, Layout.of(levers).tp_size)
    running = lever_int(levers, "max_running_requests")
    return min(default, running) if running and running > 0 else default


def sglang_default_fraction(gpu_bytes: int, levers: Mapping[str, Any], shape: ModelShape) -> float:
    """``mem_fraction_static`` as SGLang 0.5.23 picks it when the lever is unset."""
    return sglang_reserve(gpu_bytes, levers, shape).sglang_default_fraction


def effective_fraction(gpu_bytes: int, levers: Mapping[str, Any], shape: ModelShape) -> float:
    """The lever's value, else SGLang's default for this lever set."""
    value = lever_float(levers, "mem_fraction_static")
    return value if value is not None else sglang_default_fraction(gpu_bytes, levers, shape)
