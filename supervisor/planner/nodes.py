"""A server that spans nodes (``--nnodes N``), as SGLang 0.5.23 places its ranks.

(Paths under ``sglang/srt/``.) ``tp_size`` and ``pp_size`` are the whole server's; each
node runs a share of the ranks on its own GPUs (``entrypoints/engine.py:2062-2076``,
``_calculate_rank_ranges``): ``pp_per_node = max(pp // nnodes, 1)``, ``nnodes_per_pp_rank
= max(nnodes // pp, 1)``, ``tp_per_node = tp // nnodes_per_pp_rank`` — ``tp × pp /
nnodes`` ranks per node wherever the placement covers every rank. SGLang refuses
``tp × pp`` not divisible by ``nnodes`` (``arg_groups/validation_hook.py:178-181``) and
data-parallel replicas across nodes (``:199-202``); attention DP lives inside the TP group
and adds no rank. Each rank holds the same per-rank cell and pool as on one host: the
KV math (``cells``, ``pools``) is per rank and does not change with the node count.

The GPU count the planner is given is one node's; host RAM is one node's too, so a host
pool is budgeted over the ranks of one node (SGLang's auto-sizing divides by
``launch_world_size // nnodes``, ``mem_cache/pool_host/base.py:68-81``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sglang_supervisor.planner.inputs import lever_int
from sglang_supervisor.sglang.layout import Layout


def nnodes_of(levers: Mapping[str, Any]) -> int:
    """The ``nnodes`` lever, at least 1."""
    return max(1, lever_int(levers, "nnodes") or 1)


@dataclass(frozen=True)
class NodeShare:
    """One node's share of a lever set's ranks (every node's is the same)."""

    nnodes: int
    #: Scheduler processes of the whole server, and of one node.
    ranks: int
    ranks_per_node: int
    tp_per_node: int
    pp_per_node: int
    #: Visible GPUs one node needs (its ranks' highest GPU id + 1).
    gpus_needed_per_node: int

    @classmethod
    def of(cls, levers: Mapping[str, Any]) -> NodeShare:
        lay = Layout.of(levers)
        nnodes = nnodes_of(levers)
        if nnodes == 1:
            return cls(1, lay.ranks, lay.ranks, lay.tp_size, lay.pp_size, lay.gpus_needed)
        # entrypoints/engine.py:2062-2076 (_calculate_rank_ranges).
        pp_per_node = max(lay.pp_size // nnodes, 1)
        nnodes_per_pp_rank = max(nnodes // lay.pp_size, 1)
        tp_per_node = max(1, lay.tp_size // nnodes_per_pp_rank)
        node = Layout.of({**levers, "tp_size": tp_per_node, "pp_size": pp_per_node, "dp_size": 1})
        return cls(
            nnodes=nnodes,
            ranks=lay.ranks,
            ranks_per_node=pp_per_node * tp_per_node,
            tp_per_node=tp_per_node,
            pp_per_node=pp_per_node,
            gpus_needed_per_node=node.gpus_needed,
        )

    def problem(self, levers: Mapping[str, Any]) -> str | None:
        """Why SGLang cannot place ``levers`` (this share's) on its nodes; None: it can."""
        if self.nnodes == 1:
            return None
        lay = Layout.of(levers)
        tp_pp = lay.tp_size * lay.pp_size
        if tp_pp % self.nnodes:
            return (
                f"tp_size × pp_size = {tp_pp} is not divisible by nnodes {self.nnodes}: "
                "SGLang places tp×pp/nnodes ranks on each node and refuses it "
                "(validation_hook.py:178-181); pick tp_size/pp_size whose product nnodes divides"
            )
        if lay.dp_size > 1:
            return (
                f"dp_size {lay.dp_size} with nnodes {self.nnodes}: SGLang refuses "
                "data-parallel replicas across nodes (validation_hook.py:199-202); use "
                "attn_dp_size instead"
            )
        if self.ranks_per_node * self.nnodes != self.ranks:
            return (
                f"tp_size {lay.tp_size} × pp_size {lay.pp_size} over nnodes {self.nnodes}: "
                f"SGLang puts {self.tp_per_node} TP × {self.pp_per_node} PP ranks on each node "
                f"(entrypoints/engine.py:2062-2076), {self.ranks_per_node * self.nnodes} of "
                f"the {self.ranks} ranks; make pp_size a multiple or a divisor of nnodes"
            )
        return None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def candidate_node_problem(current: Mapping[str, Any], candidate: Mapping[str, Any]) -> str | None:
    """Why a proposed lever set breaks the current node layout (None: it keeps it): it
    may neither raise ``nnodes`` (the nodes are the allocation's, not the planner's to
    add) nor change tp/pp so that ``tp × pp % nnodes != 0``."""
    now, new = nnodes_of(current), nnodes_of(candidate)
    if new > now:
        return f"it asks for nnodes {new}, more than the {now} node(s) the server spans now"
    lay = Layout.of(candidate)
    tp_pp = lay.tp_size * lay.pp_size
    if tp_pp % new:
        return (
            f"its tp_size {lay.tp_size} × pp_size {lay.pp_size} = {tp_pp} is not divisible by "
            f"nnodes {new} (SGLang places tp×pp/nnodes ranks on each node)"
        )
    return NodeShare.of(candidate).problem(candidate)
