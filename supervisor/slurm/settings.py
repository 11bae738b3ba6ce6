"""The ``[slurm]`` settings and the one rule for the node levers.

``nnodes`` is a lever (the nodes the server spans, at most the allocation's); each node's
``--node-rank`` and the group's ``--dist-init-addr`` are rendered by the launcher
(``sglang_supervisor.slurm.task``), never set by a lever. On the local launcher a server spans
one host: ``nnodes`` > 1 is refused there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from sglang_supervisor.host.gpu import GpuInfo

Launcher = Literal["local", "slurm"]


class SlurmSettings(BaseModel):
    """The ``[slurm]`` table: how the server's job step is launched."""

    model_config = ConfigDict(extra="forbid")

    #: Slurm's commands (a full path where they are not on PATH).
    srun: str = "srun"
    scancel: str = "scancel"
    scontrol: str = "scontrol"
    #: The port of ``--dist-init-addr`` on the first node (SGLang's rendezvous).
    dist_init_port: int = Field(29500, ge=1, le=65535)
    #: Extra options of the server's ``srun`` (e.g. ``["--gres=gpu:8", "--exclusive"]``).
    extra_args: list[str] = Field(default_factory=list)
    #: Extra options of the per-node probes' ``srun --overlap``: where cgroups hide the
    #: GPUs from a step without them (``ConstrainDevices``), e.g. ``["--gres=gpu:8"]``.
    probe_args: list[str] = Field(default_factory=list)
    #: How long one question to the nodes (through the per-node presence) may take: less
    #: than a Prometheus scrape's 10 s, so a sick node holds nothing up for longer.
    probe_timeout_s: float = Field(5.0, gt=0)
    #: How often each node's presence samples its GPUs, RAM and our processes: what
    #: ``/status`` and ``/metrics`` show (with its age), never waiting on a node.
    sample_interval_s: float = Field(1.0, gt=0, le=60)
    #: A node of the server's step whose processes are stopped, in D state or gone this
    #: long is stuck: the whole group is recovered, naming the node.
    stuck_after_s: float = Field(10.0, gt=0)
    #: Replicas in one allocation (one daemon and server per node or group of nodes):
    #: this daemon's share is ``node_count`` of the allocation's nodes (0: all the rest)
    #: from the one at index ``first_node`` (its server's node 0).
    first_node: int = Field(0, ge=0)
    node_count: int = Field(0, ge=0)


#: The levers the slurm launcher owns, and why.
OWNED_NODE_LEVERS: dict[str, str] = {
    "node_rank": "each node's task renders --node-rank from its SLURM_NODEID",
    "dist_init_addr": "the launcher renders --dist-init-addr from the allocation's first node "
    "and slurm.dist_init_port",
}


def _int(levers: Mapping[str, Any], name: str) -> int:
    value = levers.get(name)
    if value is None or isinstance(value, bool):
        return 1
    try:
        return int(value)
    except (TypeError, ValueError):
        return 1


def node_lever_problems(
    levers: Mapping[str, Any],
    launcher: Launcher,
    *,
    allocation_nodes: int | None,
    gpus_per_node: int | None = None,
) -> list[tuple[str, str]]:
    """``(lever, message)`` for every node lever ``launcher`` cannot launch (the one rule).

    ``allocation_nodes``: the nodes of the daemon's Slurm allocation (None: unknown);
    ``gpus_per_node``: the managed GPUs of one node (None: unchecked).
    """
    nnodes = _int(levers, "nnodes")
    problems: list[tuple[str, str]] = []
    if launcher == "local":
        if nnodes > 1:
            problems.append(
                (
                    "nnodes",
                    f"--nnodes {nnodes}: a server that spans hosts needs "
                    'server.launcher = "slurm" (the daemon in a Slurm allocation launches it '
                    "as one job step; docs/slurm.md); this launcher starts one host's "
                    "processes only",
                )
            )
        return problems
    for name, why in OWNED_NODE_LEVERS.items():
        if levers.get(name) is not None:
            problems.append((name, f"cannot be set by a lever under launcher slurm: {why}"))
    if allocation_nodes is not None and nnodes > allocation_nodes:
        problems.append(
            (
                "nnodes",
                f"--nnodes {nnodes} is more than the {allocation_nodes} nodes of this Slurm "
                f"allocation (job {os.environ.get('SLURM_JOB_ID', '?')}; this daemon's share: "
                f"slurm.first_node, slurm.node_count); ask for at most {allocation_nodes}, or "
                "run the daemon in a larger allocation (sbatch -N)",
            )
        )
    ranks = _int(levers, "tp_size") * _int(levers, "pp_size")
    # SGLang 0.5.23 refuses this too (arg_groups/validation_hook.py:178-181, "tp_size must
    # be divisible by number of nodes"); said here with the fix, and where no SGLang runs.
    if ranks % nnodes:
        problems.append(
            (
                "nnodes",
                f"tp_size × pp_size = {ranks} ranks do not split evenly over --nnodes {nnodes} "
                "(SGLang places tp×pp/nnodes ranks on each node); pick nnodes dividing "
                f"{ranks}",
            )
        )
    elif gpus_per_node is not None and ranks // nnodes > gpus_per_node:
        problems.append(
            (
                "tp_size",
                f"{ranks} ranks over {nnodes} node(s) put {ranks // nnodes} on each node, "
                f"but each node has {gpus_per_node} managed GPUs; raise nnodes or lower "
                "tp_size/pp_size",
            )
        )
    return problems


def check_node_levers(
    levers: Mapping[str, Any],
    launcher: Launcher,
    managed: int | Sequence[GpuInfo],
    env: Mapping[str, str] | None = None,
) -> list[tuple[str, str]]:
    """``node_lever_problems`` with this daemon's facts: its nodes — those its managed GPUs
    are on (``<node>/<uuid>``, every node of its share of the allocation,
    ``sglang_supervisor.slurm.probe``), else the allocation's from Slurm's environment —
    and its managed GPUs shared evenly among them."""
    from sglang_supervisor.slurm.allocation import allocation_nodes

    count = managed if isinstance(managed, int) else len(managed)
    nodes = None
    if launcher == "slurm":
        names = (
            set()
            if isinstance(managed, int)
            else {g.uuid.partition("/")[0] for g in managed if "/" in g.uuid}
        )
        nodes = len(names) or allocation_nodes(env)
    per_node = count // nodes if nodes else None
    return node_lever_problems(levers, launcher, allocation_nodes=nodes, gpus_per_node=per_node)
