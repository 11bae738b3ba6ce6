"""Stop and release: the server's teardown (``teardown``, ``stop_and_release``), the
verification through NVML that its GPUs are released, how long each may take
(``release_timeout``, ``teardown_budget``), and who counts as ours meanwhile
(``members_now``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from sglang_supervisor.host import preflight
from sglang_supervisor.host.backend import ServerHandle
from sglang_supervisor.host.gpu import FOREIGN_ADVICE, GpuSample, wait_released
from sglang_supervisor.host.teardown import TeardownReport
from sglang_supervisor.operations import FAILED, SUCCEEDED, Operation
from sglang_supervisor.phases import PhaseName
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.states import ServerState
from sglang_supervisor.units import GiB, MiB

if TYPE_CHECKING:
    from sglang_supervisor.engine.supervisor import Supervisor

log = logging.getLogger("supervisor")
S = ServerState


def members_now(sup: Supervisor) -> set[int]:
    """Pids of every process of ours (blocking: a /proc scan)."""
    handle = sup.server.handle if sup.server is not None else None
    return sup.procs.members(handle, tag=None, tag_prefix=sup.tag_prefix)


async def teardown(
    sup: Supervisor, handle: ServerHandle | None, *, exclude_tag: str | None = None
) -> TeardownReport:
    """The staged stop (``sglang_supervisor.host.teardown``): SIGTERM to the launcher alone and up
    to ``stop_grace_s`` for it to drain and exit (no wait when the shutdown is forced, also
    once it is forced in the middle of that wait), then SIGTERM to every member left,
    SIGKILL to the survivors. Every process of this instance goes (but the launch tagged
    ``exclude_tag``: one being adopted). Runs to its end in a worker thread."""
    t = sup.settings.timeouts
    return await asyncio.to_thread(
        sup.procs.teardown,
        handle,
        tag=None if handle is None else handle.tag,
        tag_prefix=sup.tag_prefix,
        exclude_tag=exclude_tag,
        grace_s=0.0 if sup.stop_request.forced else t.stop_grace_s,
        kill_timeout_s=t.kill_timeout_s,
        # A second shutdown request during the grace period: SIGKILL now.
        cut_grace=sup.stop_request.is_forced,
    )


def release_timeout(sup: Supervisor, levers: LeverSet | None) -> float:
    """How long GPU memory may take to come back: longer for a pinned host pool."""
    t = sup.settings.timeouts
    if levers is None:
        return t.release_timeout_s
    gpu_total = min((g.memory_total_bytes for g in sup.managed), default=0)
    pinned_gib = preflight.pinned_host_bytes(levers.levers, gpu_total) / GiB
    return t.release_timeout_s + t.release_s_per_pinned_gib * pinned_gib


def teardown_budget(sup: Supervisor) -> float:
    """The longest a shutdown may take: the rest of a drain in progress (unless forced),
    grace + kill wait + release (pinned memory)."""
    t = sup.settings.timeouts
    levers = sup.server.levers if sup.server is not None else None
    drain = sup.stop_request.drain_left(sup.clock())
    return drain + t.stop_grace_s + t.kill_timeout_s + release_timeout(sup, levers)


async def stop_and_release(
    sup: Supervisor, op: Operation, reason: str, then: ServerState, prefix: str = ""
) -> bool:
    """stopping -> releasing -> ``then`` (or failed). Returns whether GPUs are released.

    The staged stop (``teardown``: the launcher drains within ``stop_grace_s``, then
    SIGTERM to the members left, then SIGKILL), then wait until every managed GPU shows
    no member and baseline memory. Never interrupted: a cancel or shutdown request waits
    for it to end.
    """
    if sup.state not in (S.STOPPING, S.RELEASING):
        sup.transition(S.STOPPING, reason)
    handle = sup.server.handle if sup.server is not None else None
    levers = sup.server.levers if sup.server is not None else None
    ph = op.phase(prefix + PhaseName.STOP)
    report = await teardown(sup, handle)
    ph.end(SUCCEEDED if report.clean else FAILED, report.describe())
    sup.events.publish("teardown", operation=op.id, **report.to_json())
    if sup.state == S.STOPPING:
        sup.transition(S.RELEASING, reason)
    ph = op.phase(prefix + PhaseName.RELEASE)
    known = set(report.members)

    def members() -> set[int]:
        return known | {s.pid for s in report.survivors}

    t = sup.settings.timeouts
    loop = asyncio.get_running_loop()

    def on_sample(samples: list[GpuSample]) -> None:
        data = [{"index": s.index, "memory_used_bytes": s.memory_used_bytes} for s in samples]
        loop.call_soon_threadsafe(
            lambda: sup.events.publish("release_sample", operation=op.id, gpus=data)
        )

    baseline, tolerance = sup.baseline, t.release_tolerance_mib * MiB
    if any(i not in baseline for i in sup.gpu_indices()):
        # Never measured (the start failed before it could be): judge by member pids
        # alone rather than call a GPU empty against a made-up baseline.
        log.warning("no GPU baseline yet: release is judged by member processes only")
        baseline, tolerance = {g.index: g.memory_total_bytes for g in sup.managed}, 0
    result = await asyncio.to_thread(
        wait_released,
        sup.probe,
        sup.gpu_indices(),
        baseline,
        members,
        timeout_s=release_timeout(sup, levers),
        tolerance_bytes=tolerance,
        consecutive=t.release_samples,
        interval_s=t.release_interval_s,
        on_sample=on_sample,
    )
    sup.server = None
    await sup.journal.record_gone()
    if result.released:
        ph.end(SUCCEEDED, result.describe())
        sup.transition(then, f"{reason}: GPUs released")
        return True
    why = result.describe()
    if report.survivors:
        why += "; still alive: " + "; ".join(s.describe() for s in report.survivors)
    foreign = sorted({p for g in result.gpus for p in g.foreign_pids})
    if foreign and not result.blocked_by:  # blocked_by: describe() named them already
        why += f"; processes not ours on the GPUs: pids {foreign}; {FOREIGN_ADVICE}"
    ph.end(FAILED, why)
    sup.transition(S.FAILED, why)
    return False
