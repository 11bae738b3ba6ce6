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

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The most ranks (and the largest single parallel size) a lever set may ask for. One host
#: holds at most a few dozen GPUs (an NVL72 rack: 72), so anything above is a typo or an
#: attack; refusing it up front keeps every later step (preflight, the planner, the
#: simulated server's one child per rank) from sizing anything by it.
MAX_RANKS = 1024
#: The levers that size the parallel layout (``nnodes`` and ``ep_size`` count ranks too).
SIZE_LEVERS = ("tp_size", "pp_size", "dp_size", "attn_dp_size", "ep_size", "nnodes")


def _int(levers: Mapping[str, Any], name: str, default: int) -> int:
    value = levers.get(name)
    if value is None or isinstance(value, bool):
        return default
    try:
        return int(float(value))
    except (TypeError, ValueError, OverflowError):  # OverflowError: "1e400", Infinity
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

    def gpu_id(self, rank: int) -> int:
        """The GPU id of scheduler ``rank`` (replica-major, then PP, then TP), relative to
        the visible GPUs: arithmetic, so a request's absurd size never builds a list."""
        tp, pp, step = self.tp_size, self.pp_size, max(1, self.gpu_id_step)
        replica, rest = divmod(rank, tp * pp)
        pp_rank, tp_rank = divmod(rest, tp)
        return self.base_gpu_id + replica * tp * pp * step + pp_rank * tp + tp_rank * step

    @property
    def gpus_needed(self) -> int:
        """Visible GPUs the server needs: its highest GPU id + 1 (the last rank's id: every
        term of ``gpu_id`` grows with the rank's coordinates)."""
        return self.gpu_id(self.ranks - 1) + 1

    @property
    def ranks_per_gpu(self) -> int:
        """The most ranks placed on one GPU (1 unless the ids collide).

        Replicas never share a GPU (one spans fewer than ``tp × pp × step`` ids). Inside a
        replica, ranks ``(p, t)`` and ``(p + k·step/g, t - k·tp/g)`` share one, with
        ``g = gcd(tp, step)``: a chain holds at most ``g`` TP ranks and ``⌈pp / (step/g)⌉``
        PP ranks. Computed, not counted: the sizes come from a request."""
        step = max(1, self.gpu_id_step)
        g = math.gcd(self.tp_size, step)
        return min(g, -(-self.pp_size // (step // g)))

    def gpu_ids_outside(self, count: int, limit: int = 8) -> list[int]:
        """Up to ``limit`` of the GPU ids ≥ ``count`` that ranks sit on, lowest first. Only a
        layout of at most ``MAX_RANKS`` ranks is walked; a larger one names its highest id
        (it is refused for its size anyway, see ``size_problems``)."""
        if self.gpus_needed <= count:
            return []
        if self.ranks > MAX_RANKS:
            return [self.gpus_needed - 1]
        return sorted({g for r in range(self.ranks) if (g := self.gpu_id(r)) >= count})[:limit]

    def _id_span(self) -> str:
        first, last = self.base_gpu_id, self.gpus_needed - 1
        if first == last:
            return str(first)
        dense = self.ranks == last - first + 1 and self.ranks_per_gpu == 1
        if dense:
            return f"{first}-{last}"
        if self.ranks <= 16:
            return str(sorted({self.gpu_id(r) for r in range(self.ranks)}))
        return f"{first} to {last} (not contiguous)"

    def describe_sizes(self) -> str:
        """``tp_size 8 × pp_size 1 × dp_size 1``."""
        return f"tp_size {self.tp_size} × pp_size {self.pp_size} × dp_size {self.dp_size}"

    def describe(self) -> str:
        """``tp_size 8 × pp_size 1 × dp_size 1 = 8 ranks (attention DP 8 inside TP) on GPU
        ids 0-7``: the arithmetic behind ``ranks`` and ``gpus_needed``."""
        text = f"{self.describe_sizes()} = {self.ranks} ranks"
        if self.attn_dp_size > 1:
            text += f" (attention DP {self.attn_dp_size} inside TP, no extra GPU)"
        text += f" on GPU ids {self._id_span()}"
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


def size_problems(levers: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(lever, message) for a parallel size, or a rank count, above ``MAX_RANKS``: refused
    before anything is sized by it (milliseconds, no memory growth)."""
    out: list[tuple[str, str]] = []
    for name in SIZE_LEVERS:
        value = _int(levers, name, 1)
        if value > MAX_RANKS:
            out.append(
                (
                    name,
                    f"{name} {value} is more than any one server can have: at most "
                    f"{MAX_RANKS} (a host holds a few dozen GPUs); set the number of GPUs "
                    "the server should use",
                )
            )
    if out:
        return out
    shape = Layout.of(levers)
    if shape.ranks > MAX_RANKS:
        sizes = {"tp_size": shape.tp_size, "pp_size": shape.pp_size, "dp_size": shape.dp_size}
        largest = max(sizes, key=lambda k: sizes[k])
        out.append(
            (
                largest,
                f"{shape.describe_sizes()} = {shape.ranks} ranks, more than any one server "
                f"can have: at most {MAX_RANKS}; lower tp_size, pp_size or dp_size",
            )
        )
    return out


def layout(levers: Mapping[str, Any]) -> Layout:
    """The parallel layout of ``levers`` (see ``Layout``)."""
    return Layout.of(levers)
