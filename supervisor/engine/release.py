"""Stop and release: the server's teardown (``teardown``, ``stop_and_release``), the
verification through NVML that its GPUs are released, how long each may take
(``release_timeout``, ``teardown_budget``), and who counts as ours meanwhile
(``members_now``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from sglang_supervisor.config import TimeoutSettings
from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ReadRecord, ServerRecord
from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.host import preflight
from sglang_supervisor.host.backend import ServerHandle
from sglang_supervisor.host.gpu import FOREIGN_ADVICE, GpuInfo, GpuSample, wait_released
from sglang_supervisor.host.teardown import TeardownReport
from sglang_supervisor.operations import FAILED, SUCCEEDED, Operation
from sglang_supervisor.phases import PhaseName
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.states import ServerState
from sglang_supervisor.units import GiB, MiB

log = logging.getLogger("supervisor")
S = ServerState


def members_now(parts: Parts, record: ReadRecord) -> set[int]:
    """Pids of every process of ours (blocking: a /proc scan)."""
    handle = record.server.handle if record.server is not None else None
    return parts.procs.members(handle, tag=None, tag_prefix=parts.tag_prefix)


async def teardown(
    parts: Parts, stop: StopRequest, handle: ServerHandle | None, *, exclude_tag: str | None = None
) -> TeardownReport:
    """The staged stop (``sglang_supervisor.host.teardown``): SIGTERM to the launcher alone and up
    to ``stop_grace_s`` for it to drain and exit (no wait when the shutdown is forced, also
    once it is forced in the middle of that wait), then SIGTERM to every member left,
    SIGKILL to the survivors. Every process of this instance goes (but the launch tagged
    ``exclude_tag``: one being adopted). Runs to its end in a worker thread."""
    t = parts.settings.timeouts
    return await asyncio.to_thread(
        parts.procs.teardown,
        handle,
        tag=None if handle is None else handle.tag,
        tag_prefix=parts.tag_prefix,
        exclude_tag=exclude_tag,
        grace_s=0.0 if stop.forced else t.stop_grace_s,
        kill_timeout_s=t.kill_timeout_s,
        # A second shutdown request during the grace period: SIGKILL now.
        cut_grace=stop.is_forced,
    )


def release_timeout(
    t: TimeoutSettings, managed: Sequence[GpuInfo], levers: LeverSet | None
) -> float:
    """How long GPU memory may take to come back: longer for a pinned host pool."""
    if levers is None:
        return t.release_timeout_s
    gpu_total = min((g.memory_total_bytes for g in managed), default=0)
    pinned_gib = preflight.pinned_host_bytes(levers.levers, gpu_total) / GiB
    return t.release_timeout_s + t.release_s_per_pinned_gib * pinned_gib


def teardown_budget(parts: Parts, record: ReadRecord, stop: StopRequest) -> float:
    """The longest a shutdown may take: the rest of a drain in progress (unless forced),
    grace + kill wait + release (pinned memory)."""
    t = parts.settings.timeouts
    levers = record.server.levers if record.server is not None else None
    drain = stop.drain_left(parts.clock())
    return (
        drain
        + t.stop_grace_s
        + t.kill_timeout_s
        + release_timeout(parts.settings.timeouts, record.managed, levers)
    )


async def stop_and_release(
    parts: Parts,
    record: ServerRecord,
    stop: StopRequest,
    op: Operation,
    reason: str,
    then: ServerState,
    prefix: str = "",
) -> bool:
    """stopping -> releasing -> ``then`` (or failed). Returns whether GPUs are released.

    The staged stop (``teardown``: the launcher drains within ``stop_grace_s``, then
    SIGTERM to the members left, then SIGKILL), then wait until every managed GPU shows
    no member and baseline memory. Never interrupted: a cancel or shutdown request waits
    for it to end.
    """
    if record.state not in (S.STOPPING, S.RELEASING):
        record.transition(S.STOPPING, reason)
    handle = record.server.handle if record.server is not None else None
    levers = record.server.levers if record.server is not None else None
    ph = op.phase(prefix + PhaseName.STOP)
    report = await teardown(parts, stop, handle)
    ph.end(SUCCEEDED if report.clean else FAILED, report.describe())
    parts.events.publish("teardown", operation=op.id, **report.to_json())
    if record.state == S.STOPPING:
        record.transition(S.RELEASING, reason)
    ph = op.phase(prefix + PhaseName.RELEASE)
    known = set(report.members)

    def members() -> set[int]:
        return known | {s.pid for s in report.survivors}

    t = parts.settings.timeouts
    loop = asyncio.get_running_loop()

    def on_sample(samples: list[GpuSample]) -> None:
        data = [{"index": s.index, "memory_used_bytes": s.memory_used_bytes} for s in samples]
        loop.call_soon_threadsafe(
            lambda: parts.events.publish("release_sample", operation=op.id, gpus=data)
        )

    baseline, tolerance = record.baseline, t.release_tolerance_mib * MiB
    if any(i not in baseline for i in record.gpu_indices()):
        # Never measured (the start failed before it could be): judge by member pids
        # alone rather than call a GPU empty against a made-up baseline.
        log.warning("no GPU baseline yet: release is judged by member processes only")
        baseline, tolerance = {g.index: g.memory_total_bytes for g in record.managed}, 0
    result = await asyncio.to_thread(
        wait_released,
        parts.probe,
        record.gpu_indices(),
        baseline,
        members,
        timeout_s=release_timeout(parts.settings.timeouts, record.managed, levers),
        tolerance_bytes=tolerance,
        consecutive=t.release_samples,
        interval_s=t.release_interval_s,
        on_sample=on_sample,
    )
    record.server_gone()
    await parts.journal.record_gone()
    if result.released:
        ph.end(SUCCEEDED, result.describe())
        record.transition(then, f"{reason}: GPUs released")
        return True
    why = result.describe()
    if report.survivors:
        why += "; still alive: " + "; ".join(s.describe() for s in report.survivors)
    foreign = sorted({p for g in result.gpus for p in g.foreign_pids})
    if foreign and not result.blocked_by:  # blocked_by: describe() named them already
        why += f"; processes not ours on the GPUs: pids {foreign}; {FOREIGN_ADVICE}"
    ph.end(FAILED, why)
    record.transition(S.FAILED, why)
    return False
