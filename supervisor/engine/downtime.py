"""An apply's expected time without service, before anything is stopped: the planner's
rule (``planner.downtime``) on this daemon's figures — its timeouts and router, the
serving server's measured start, the host pools both lever sets pin as preflight sizes
them. The operation carries it (``Operation.expected_downtime``) beside what it then
measures (``Operation.downtime``, from its phases)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.plan_inputs import server_facts
from sglang_supervisor.engine.record import ReadRecord
from sglang_supervisor.host import preflight
from sglang_supervisor.host.gpu import GpuInfo
from sglang_supervisor.planner.downtime import ChangeFacts, expected
from sglang_supervisor.planner.memory import decode_graph_sizes, decode_graphs_on, decode_max_bs
from sglang_supervisor.planner.nodes import NodeShare
from sglang_supervisor.sglang.levers import LeverSet

#: Levers that change the weights each GPU loads: the measured start may not hold.
WEIGHT_LEVERS = (
    "model_path",
    "revision",
    "quantization",
    "load_format",
    "dtype",
    "tp_size",
    "pp_size",
    "dp_size",
    "attn_dp_size",
    "enable_dp_attention",
    "speculative_algorithm",
    "speculative_draft_model_path",
)


async def expected_for(
    parts: Parts, record: ReadRecord, new: LeverSet, drain_s: float
) -> dict[str, Any]:
    """``Operation.expected_downtime`` of an apply to ``new`` (the facts are read on the
    loop; the host's RAM, which sizes an auto-sized pool, in a worker thread)."""
    facts = server_facts(parts, record, drain_s)
    serving = record.server.levers if record.server is not None else None
    managed = tuple(record.managed)
    sim_ram = parts.backend.simulated_host_ram_bytes
    now_pinned, new_pinned = await asyncio.to_thread(
        _pinned, managed, sim_ram, serving.levers if serving else None, new.levers
    )
    gpu = min((g.memory_total_bytes for g in managed), default=0)
    old = serving.levers if serving is not None else {}
    changed = [k for k in WEIGHT_LEVERS if old.get(k) != new.levers.get(k)]
    caveat = None
    if changed and serving is not None:
        caveat = f"{', '.join(changed)} changed: the new set's load may differ from it"
    change = ChangeFacts(
        facts,
        now_pinned,
        new_pinned,
        load_caveat=caveat,
        graphs_now=_graphs(gpu, old) if serving is not None else None,
        graphs_new=_graphs(gpu, new.levers),
    )
    return expected(change).to_json()


def _graphs(gpu_bytes: int, levers: Mapping[str, Any]) -> int:
    if not decode_graphs_on(levers):
        return 0
    return len(decode_graph_sizes(decode_max_bs(gpu_bytes, levers)))


def _pinned(
    managed: Sequence[GpuInfo],
    sim_ram: int | None,
    serving: Mapping[str, Any] | None,
    new: Mapping[str, Any],
) -> tuple[int, int]:
    """One node's pinned host pool now and with ``new``, as preflight sizes them (the
    running pool counted as freed for the new one's auto-sizing). Blocking (/proc)."""
    gpu = min((g.memory_total_bytes for g in managed), default=0)
    host = preflight.host_facts(sim_ram)
    held = 0
    if serving is not None:
        host, held = preflight.running_host_pool(serving, gpu, host)
    # What the new server finds once the running one's pool is freed (as preflight counts).
    available = host.available_ram_bytes + held
    pinned = preflight.pinned_host_bytes(new, gpu, available)
    now_nodes = NodeShare.of(serving).nnodes if serving is not None else 1
    return held // now_nodes, pinned // NodeShare.of(new).nnodes
