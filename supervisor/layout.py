"""SGLang 0.5.23's parallel layout of one server: its ranks and the GPUs they sit on.

The one definition of "how many GPUs / ranks a lever set needs", used by preflight, the
planner and the simulated server. Pure: it reads a lever mapping, nothing else.

The facts (SGLang 0.5.23):

* ``--enable-dp-attention --dp-size N`` is the deprecated spelling of ``--attn-dp-size N``:
  when ``attn_dp_size`` is 1 the width moves to ``attn_dp_size`` and ``dp_size`` becomes 1
  (``arg_groups/parallel_hook.py:39-61``, ``handle_deprecated_dp_attention``).
* Attention DP runs inside the TP group and adds no GPU: the world is ``dp × tp × pp``
  (``server_args.py:581-589``, ``compute_world_size``); one scheduler process per TP × PP
  rank of each replica (``entrypoints/engine.py:932-939``).
* A rank's GPU id (relative to ``CUDA_VISIBLE_DEVICES``) is ``base_gpu_id + replica ×
  tp × pp × gpu_id_step + pp_rank × tp + tp_rank × gpu_id_step``
  (``managers/data_parallel_controller.py:445-449`` and ``:747-752``; the PP term is not
  multiplied by the step, so a step above 1 with PP can put two ranks on one GPU).
* SGLang refuses ``attn_dp_size`` > 1 with ``dp_size`` > 1
  (``arg_groups/parallel_hook.py:287-292``), a ``tp_size`` not divisible by
  ``attn_dp_size`` (``:326``), ``base_gpu_id`` < 0 and ``gpu_id_step`` < 1
  (``arg_groups/validation_hook.py:204-205``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def _int(levers: Mapping[str, Any], name: str, default: int) -> int:
    value = levers.get(name)
    if value is None or isinstance(value, bool):
        return default
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return default


def _true(levers: Mapping[str, Any], name: str) -> bool:
    value = levers.get(name)
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


@dataclass(frozen=True)
class Layout:
    """One server's ranks, as SGLang 0.5.23 resolves and places them (one node)."""

    tp_size: int
    pp_size: int
    #: Data-parallel replicas (after the deprecated attention-DP spelling is resolved).
    dp_size: int
    #: Attention-DP groups inside the TP group (1: off).
    attn_dp_size: int
    base_gpu_id: int
    gpu_id_step: int

    @classmethod
    def of(cls, levers: Mapping[str, Any]) -> Layout:
        tp = max(1, _int(levers, "tp_size", 1))
        pp = max(1, _int(levers, "pp_size", 1))
        dp = max(1, _int(levers, "dp_size", 1))
        attn_dp = max(1, _int(levers, "attn_dp_size", 1))
        if _true(levers, "enable_dp_attention") and attn_dp == 1:
            attn_dp, dp = dp, 1
        return cls(
            tp_size=tp,
            pp_size=pp,
            dp_size=dp,
            attn_dp_size=attn_dp,
            base_gpu_id=_int(levers, "base_gpu_id", 0),
            gpu_id_step=_int(levers, "gpu_id_step", 1),
        )

    @property
    def ranks(self) -> int:
        """Scheduler processes: ``dp × tp × pp`` (attention DP adds none)."""
        return self.dp_size * self.tp_size * self.pp_size

    @property
    def attn_tp_size(self) -> int:
        """Ranks that share one attention-DP group's attention (and its KV pool)."""
        return max(1, self.tp_size // self.attn_dp_size)

    @property
    def kv_pools(self) -> int:
        """Independent KV pools (request schedulers): replicas × attention-DP groups."""
        return self.dp_size * self.attn_dp_size

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        """The GPU id of each rank (replica-major, then PP, then TP), relative to the
        visible GPUs."""
        tp, pp, step = self.tp_size, self.pp_size, max(1, self.gpu_id_step)
        return tuple(
            self.base_gpu_id + replica * tp * pp * step + pp_rank * tp + tp_rank * step
            for replica in range(self.dp_size)
            for pp_rank in range(pp)
            for tp_rank in range(tp)
        )

    @property
    def gpus_needed(self) -> int:
        """Visible GPUs the server needs: its highest GPU id + 1."""
        return max(self.gpu_ids) + 1

    @property
    def ranks_per_gpu(self) -> int:
        """The most ranks placed on one GPU (1 unless the ids collide)."""
        return max(Counter(self.gpu_ids).values())

    def describe(self) -> str:
        """``tp_size 8 × pp_size 1 × dp_size 1 = 8 ranks (attention DP 8 inside TP) on GPU
        ids 0-7``: the arithmetic behind ``ranks`` and ``gpus_needed``."""
        parts = f"tp_size {self.tp_size} × pp_size {self.pp_size} × dp_size {self.dp_size}"
        text = f"{parts} = {self.ranks} ranks"
        if self.attn_dp_size > 1:
            text += f" (attention DP {self.attn_dp_size} inside TP, no extra GPU)"
        ids = sorted(set(self.gpu_ids))
        span = f"{ids[0]}-{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) else str(ids)
        if len(ids) == 1:
            span = str(ids[0])
        text += f" on GPU ids {span}"
        if self.base_gpu_id or self.gpu_id_step != 1:
            text += f" (base_gpu_id {self.base_gpu_id}, gpu_id_step {self.gpu_id_step})"
        return text

    def problems(self) -> list[tuple[str, str]]:
        """(lever, message) for each combination SGLang 0.5.23 refuses at launch."""
        out: list[tuple[str, str]] = []
        if self.attn_dp_size > 1 and self.dp_size > 1:
            out.append(
                (
                    "attn_dp_size",
                    f"dp_size {self.dp_size} with attn_dp_size {self.attn_dp_size}: SGLang "
                    "refuses data-parallel replicas combined with attention DP; set one of "
                    "them to 1",
                )
            )
        if self.tp_size % self.attn_dp_size:
            out.append(
                (
                    "attn_dp_size",
                    f"tp_size {self.tp_size} is not divisible by attn_dp_size "
                    f"{self.attn_dp_size}; SGLang refuses it: pick a divisor of tp_size",
                )
            )
        if self.base_gpu_id < 0:
            out.append(("base_gpu_id", f"base_gpu_id {self.base_gpu_id} must be ≥ 0"))
        if self.gpu_id_step < 1:
            out.append(("gpu_id_step", f"gpu_id_step {self.gpu_id_step} must be ≥ 1"))
        return out


def layout(levers: Mapping[str, Any]) -> Layout:
    """The parallel layout of ``levers`` (see ``Layout``)."""
    return Layout.of(levers)
