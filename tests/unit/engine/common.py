"""Shared helpers of the engine's unit tests: wait for an operation, look at what an
operator would see (which levers serve, whether the GPUs are free)."""

from __future__ import annotations

import asyncio

from sglang_supervisor.operations import Operation
from sglang_supervisor.phases import OpKind, PhaseName
from sglang_supervisor.states import ServerState
from tests.unit.fakes import GIB, Rig, until

S = ServerState
HELD_PER_RANK = int(0.8 * 80 * GIB)  # mem_fraction_static 0.8 of an 80 GiB fake GPU

APPLY_EDGES = [
    ("ready", "stopping"),
    ("stopping", "releasing"),
    ("releasing", "stopped"),
    ("stopped", "starting"),
    ("starting", "ready"),
]


def ops_of(rig: Rig, kind: OpKind) -> list[Operation]:
    return [op for op in rig.sup.operations.values() if op.kind == kind]


async def settle(rig: Rig, op: Operation, timeout: float = 5.0) -> Operation:
    """Wait until ``op`` has finished and the Supervisor has cleared it."""
    await asyncio.wait_for(op.done.wait(), timeout)
    await until(lambda: rig.sup.operation is not op, timeout, f"operation {op.id} to clear")
    return op


async def apply(
    rig: Rig,
    levers: dict[str, object],
    *,
    env: dict[str, str] | None = None,
    drain_timeout_s: float = 0.0,
) -> Operation:
    """Submit an apply and wait for its outcome."""
    op = await rig.sup.submit_apply(levers, env or {}, drain_timeout_s=drain_timeout_s)
    return await settle(rig, op)


def phase_detail(op: Operation, name: PhaseName | str) -> str:
    return next(p.detail for p in op.phases if p.name == name)


def launched(rig: Rig, n: int) -> bool:
    """The Supervisor has recorded (persisted, then announced) its ``n``-th launch."""
    pids = [e["pid"] for e in rig.sup.events.recent() if e["kind"] == "launch"]
    return len(rig.procs.spawns) >= n and rig.procs.handles[n - 1].pid in pids


def state_of(rig: Rig) -> ServerState:
    return rig.sup.state


def idle(rig: Rig, state: ServerState) -> bool:
    """In ``state`` with no operation running (the last one has finished and been cleared)."""
    return rig.sup.state == state and rig.sup.operation is None


def nothing_held(rig: Rig) -> bool:
    return all(v == 0 for v in rig.probe.above_baseline().values())
