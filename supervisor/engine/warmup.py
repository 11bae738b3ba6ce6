"""The ``warmup`` step of an apply: while the old server still serves, the new set's weight
files are read into the page cache (``sglang_supervisor.host.pagecache``), so the load after
the stop — or the weights update — reads memory. Skipped, with the reason in the phase,
when they do not fit in the RAM left after the hierarchical cache's needs and a margin.

The files: ``model_path`` as the server reads it (a directory, or the Hugging Face
cache's snapshot at ``revision``, in the server's environment). A model with no weight
files here (the simulated one, a hub id not downloaded) adds no phase. An operator's
cancel or a shutdown ends the reading at once; nothing was stopped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

from sglang_supervisor.engine.boundaries import Cancelled, checkpoint
from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ReadRecord
from sglang_supervisor.engine.server import server_env
from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.host import checkpoint_files as ckpt
from sglang_supervisor.host import pagecache
from sglang_supervisor.host import preflight as host_preflight
from sglang_supervisor.operations import FAILED, SUCCEEDED, Operation
from sglang_supervisor.phases import PhaseName
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.units import GB

log = logging.getLogger("supervisor")


def weight_files_of(parts: Parts, record: ReadRecord, levers: LeverSet) -> list[Path]:
    """The weight files ``levers`` load, found on this host (empty: none here).
    Blocking: reads directories."""
    lv = levers.levers
    model = str(lv.get("model_path") or "")
    where = ckpt.local_dir(model, parts.settings.server.cwd)
    if where is None:
        env = server_env(parts, record.managed, levers)
        rev = lv.get("revision")
        where = ckpt.hub_snapshot(model, None if rev is None else str(rev), env)
    if where is None:
        return []
    try:
        return [f for f in ckpt.weight_files(where) if f.is_file()]
    except ckpt.CheckpointError as exc:
        log.warning("warm-up: %s", exc)
        return []


def _budget(parts: Parts, record: ReadRecord, levers: LeverSet) -> pagecache.Budget:
    host = host_preflight.host_facts(parts.backend.simulated_host_ram_bytes)
    gpu_total = min((g.memory_total_bytes for g in record.managed), default=0)
    avail = host.available_ram_bytes
    new_pool = host_preflight.pinned_host_bytes(levers.levers, gpu_total, avail)
    server = record.server
    freed = (
        0
        if server is None
        else host_preflight.pinned_host_bytes(server.levers.levers, gpu_total, avail)
    )
    return pagecache.budget(avail, host.ram_source, new_pool, freed)


async def warm_page_cache(
    parts: Parts, record: ReadRecord, stop: StopRequest, op: Operation, levers: LeverSet
) -> None:
    """Read ``levers``' weight files into the page cache (the ``warmup`` phase). Raises
    ``Cancelled`` on an operator's cancel or a shutdown (the reading stops first)."""
    if parts.settings.timeouts.warmup_timeout_s <= 0:
        return  # turned off
    files = await asyncio.to_thread(weight_files_of, parts, record, levers)
    if not files:
        return
    ph = op.phase(PhaseName.WARMUP)
    total = sum(f.stat().st_size for f in files)
    room = await asyncio.to_thread(_budget, parts, record, levers)
    if total > room.bytes:
        ph.end(
            SUCCEEDED,
            f"skipped: the new weights ({total / GB:.1f} GB in {len(files)} files) do not "
            f"fit: {room.why} leaves {room.bytes / GB:.1f} GB",
        )
        return
    cancel = threading.Event()
    deadline = time.monotonic() + parts.settings.timeouts.warmup_timeout_s
    reading = asyncio.ensure_future(asyncio.to_thread(pagecache.read, files, cancel, deadline))
    try:
        while not reading.done():
            await asyncio.wait({reading}, timeout=max(parts.poll_s, 0.05))
            if stop.requested or op.cancel_requested is not None:
                checkpoint(stop, op)  # raises Cancelled
    except Cancelled as exc:
        cancel.set()
        await reading
        ph.end(FAILED, f"stopped: {exc}")
        raise
    got = reading.result()
    rate = got.read_bytes / got.seconds / GB if got.seconds > 0 else 0.0
    detail = (
        f"{got.read_bytes / GB:.2f} GB of {len(files)} weight files read into the page "
        f"cache in {got.seconds:.1f}s ({rate:.2f} GB/s) while pid "
        f"{record.server.handle.pid if record.server else '?'} served"
    )
    if got.stopped is not None:
        detail += f"; ended early: {got.stopped}"
    if got.errors:
        detail += f"; unreadable: {'; '.join(got.errors[:3])}"
    ph.end(SUCCEEDED, detail)
