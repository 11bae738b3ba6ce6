"""Start-up: the persisted state, the live schema, the managed GPUs; then the initial
start operation: adopt the server an earlier daemon left running, or clear leftovers of
ours, measure the GPU baseline, report an interrupted apply and launch.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_supervisor.engine import persisted as persisted_levers
from sglang_supervisor.engine import routing
from sglang_supervisor.engine.checks import refuse_if_foreign
from sglang_supervisor.engine.desired import levers_to_start
from sglang_supervisor.engine.probation import watch_probation
from sglang_supervisor.engine.release import members_now, stop_and_release, teardown
from sglang_supervisor.engine.rollback import roll_back
from sglang_supervisor.engine.server import (
    Cancelled,
    ServerInfo,
    StartFailed,
    checkpoint,
    judge_hung,
    launch_until_ready,
    wait_ready,
)
from sglang_supervisor.engine.sglang_info import after_schema
from sglang_supervisor.engine.transaction import commit, recover
from sglang_supervisor.engine.validation import check_sglang, gpu_facts, warm_resolution
from sglang_supervisor.host.backend import ServerHandle
from sglang_supervisor.host.gpu import GpuInfo, GpuQueryError, resolve_gpus
from sglang_supervisor.operations import FAILED, ROLLED_BACK, SUCCEEDED, Operation
from sglang_supervisor.phases import PhaseName, PhasePrefix, prefixed
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.states import ServerState
from sglang_supervisor.store import RecordedServer

if TYPE_CHECKING:
    from sglang_supervisor.engine.supervisor import Supervisor

log = logging.getLogger("supervisor")
S = ServerState


async def prepare(sup: Supervisor) -> None:
    """Read the state, the live schema and the GPUs; choose the levers to start with.

    Raises ``ValueError`` (bad config: unknown GPU, invalid initial levers) before
    anything is started.
    """
    sup.loading = f"the state in {sup.journal.dir}"
    persisted = await sup.journal.load()
    if sup.schema_loader is not None:
        sup.loading = (
            f"SGLang's flag schema from {sup.settings.server.python} (imports SGLang the "
            "first time: seconds)"
        )
        loaded = await asyncio.to_thread(
            sup.schema_loader, sup.settings.server.python, sup.journal.dir / "schema-cache"
        )
        sup.schema, sup.schema_live = loaded.schema, loaded.live
        sup.schema_warning = loaded.warning
        if loaded.warning:
            log.warning("%s", loaded.warning)
            sup.warn(loaded.warning)
    sup.loading = "the managed GPUs"
    sup.managed = await asyncio.to_thread(resolve_managed, sup, sup.settings.server.gpus)
    sup.loading = "the levers to start with"
    # Persisted levers were checked against the SGLang of their day: check them again
    # against this one (an upgrade may have renamed a flag); misfits are kept, not lost.
    choice = await persisted_levers.choose(sup, persisted)
    sup.last_good = choice.last_good
    # The persisted set, else the config's; with levers_source = "config" the config's.
    sup.levers = levers_to_start(sup, choice.levers)
    sup.sglang = after_schema(
        sup.schema.sglang_version, sup.schema_live, sup.schema_warning, gpu_facts(sup) is not None
    )
    await warm_resolution(sup)
    # Which SGLang answers, and whether its resolution can run, once its helper has
    # imported it (seconds): /status says "checking" meanwhile.
    sup.sglang_check = asyncio.create_task(check_sglang(sup))
    sup.loading = None
    if not sup.probe.pids_are_local():
        sup.warn(
            "GPU process ids come from another PID namespace (a container without the "
            "host's PID namespace): membership by pid is impossible, so release is "
            "decided by GPU memory alone"
        )


def resolve_managed(sup: Supervisor, names: list[str]) -> list[GpuInfo]:
    """The managed GPUs: those named (index or UUID), or every GPU the probe sees."""
    return resolve_gpus(sup.probe, names or [str(d.index) for d in sup.probe.devices()])


async def initial_start(sup: Supervisor, op: Operation) -> None:
    """Adopt the recorded server if it is healthy; else clear leftovers and launch."""
    persisted = sup.journal.recorded
    record = persisted.server
    # An operator's stop that the last daemon did not finish (it died mid-stop) is
    # finished, not undone: its server is torn down with the leftovers below.
    if record is not None and persisted.stopped_by is None and await try_adopt(sup, op, record):
        return
    # Leftovers of an earlier daemon (same instance tag) go first, so the baseline is
    # measured with nothing of ours on the GPUs.
    members = await asyncio.to_thread(members_now, sup)
    try:
        if members:
            await clear_leftovers(sup, op, members)
        await measure_baseline(sup)
    except StartFailed as exc:
        op.finish(FAILED, str(exc))
        return
    checkpoint(sup, op)
    if persisted.stopped_by is not None:
        op.phase(PhaseName.START).end(
            SUCCEEDED,
            f"not started: an operator stopped the server (operation {persisted.stopped_by}) "
            "before the daemon restarted; POST /start to start it",
        )
        op.finish(SUCCEEDED)
        return
    if await refuse_if_foreign(sup, op):
        return
    pending = persisted.pending_operation
    if pending is not None:
        op.phase(PhaseName.INTERRUPTED_APPLY).end(
            ROLLED_BACK,
            f"apply {pending.get('id')} was interrupted by the daemon's exit; "
            "starting the last-good levers",
        )
        await sup.journal.clear_pending(save=False)
    if not await launch_until_ready(sup, op, sup.levers, probation=False):
        if op.cancelled is not None:
            await cancelled_start_up(sup, op)
        else:
            await recover(sup, op, op.rollback_reason or "the initial start failed")
        return
    await routing.join(sup, op)
    await commit(sup, op, sup.levers)


async def cancelled_start_up(sup: Supervisor, op: Operation) -> None:
    """An operator cancelled the daemon's own start-up launch: that is a stop, not a
    crash. Tear it down, stay stopped (across daemon restarts too, as after a stop) and
    say so; nothing is relaunched."""
    why = (
        f"{op.cancelled}: the start-up launch was torn down and the server stays stopped; "
        "POST /start to start it"
    )
    await sup.journal.record_operator_stop(op.id)
    if await stop_and_release(sup, op, why, S.STOPPED, prefix=PhasePrefix.CLEANUP):
        op.levers_effective = None
        op.finish(FAILED, why)
    else:
        op.finish(FAILED, f"{why}; then the server could not be released: {sup.state_reason}")


async def try_adopt(sup: Supervisor, op: Operation, record: RecordedServer) -> bool:
    """Keep a server an earlier daemon left running, if it is healthy: no reload.

    Adopted when its launcher (same pid *and* create time) answers /health_generate,
    or is still starting with the last-good levers. A server of an interrupted apply
    that is not ready yet is torn down instead (the last-good levers start).
    """
    handle = await asyncio.to_thread(
        sup.procs.adopt, record.pid, record.create_time, record.tag, Path(record.log_path)
    )
    if handle is None:
        return False
    levers = LeverSet.from_json(record.levers)
    probe = await sup.health.generate_ok(sup.url, 5.0)
    interrupted_apply = sup.last_good is not None and levers != sup.last_good
    if interrupted_apply and not probe.ok:
        return False
    ph = op.phase(PhaseName.ADOPT)
    others = await asyncio.to_thread(
        sup.procs.members, None, tag=None, tag_prefix=sup.tag_prefix, exclude_tag=record.tag
    )
    if others:
        report = await teardown(sup, None, exclude_tag=record.tag)
        op.phase(prefixed(PhasePrefix.LEFTOVERS, PhaseName.STOP)).end(
            SUCCEEDED if report.clean else FAILED, f"other launches: {report.describe()}"
        )
    if sup.journal.recorded.baseline is not None:
        sup.baseline = dict(sup.journal.recorded.baseline)
    else:
        sup.baseline = {g.index: 0 for g in sup.managed}
        sup.warn("no recorded GPU baseline: release is judged against 0 bytes + tolerance")
    sup.server = ServerInfo(handle=handle, levers=levers)
    sup.transition(
        S.STARTING,
        f"adopting pid {record.pid} (launch {record.tag}) left running by an earlier daemon",
    )
    try:
        if not probe.ok and record.ready:
            await judge_hung(sup, op, handle, probe.detail)
        await wait_ready(sup, op, handle)
    except StartFailed as exc:
        ph.end(FAILED, str(exc))
        await recover(sup, op, str(exc))
        return True
    except Cancelled as exc:  # an operator would rather act than wait for it
        if exc.shutdown:
            raise
        ph.end(FAILED, str(exc))
        why = f"{exc}; pid {record.pid} was torn down: POST /start or /levers"
        await stop_and_release(sup, op, why, S.STOPPED, prefix=PhasePrefix.CLEANUP)
        op.finish(FAILED, why)
        return True
    ph.end(SUCCEEDED, f"pid {record.pid} adopted: no restart, levers {levers.digest()}")
    if interrupted_apply and not await finish_probation(sup, op, handle):
        return True
    await routing.join(sup, op)  # make sure the router lists it (a no-op when it does)
    if sup.last_good is None or interrupted_apply:
        # The interrupted apply had reached ready and passed its probation: finish it.
        await commit(sup, op, levers)
    else:
        await sup.journal.clear_pending()
        op.levers_effective = levers.to_json()
        op.finish(SUCCEEDED)
    return True


async def finish_probation(sup: Supervisor, op: Operation, handle: ServerHandle) -> bool:
    """The interrupted apply's server is ready, but its probation never ended: watch it
    for the whole window now; untested levers never become last-good. On a failure or an
    operator's cancel, roll back to the last-good levers and clear the pending apply
    (False)."""
    if sup.settings.timeouts.probation_s <= 0:
        return True
    ph = op.phase(PhaseName.PROBATION)
    try:
        await watch_probation(sup, op, handle)
    except StartFailed as exc:
        ph.end(FAILED, str(exc))
        await roll_back(sup, op, f"the interrupted apply's new server failed probation: {exc}")
        await sup.journal.clear_pending()
        return False
    except Cancelled as exc:
        if exc.shutdown:
            raise
        # Cancelled like any apply's probation, whoever started it: the untested levers
        # are rolled back and the pending apply cleared (else the next daemon commits them).
        ph.end(FAILED, f"{exc} while pid {handle.pid} was in probation")
        await roll_back(sup, op, f"the interrupted apply's probation: {exc}")
        await sup.journal.clear_pending()
        return False
    ph.end(SUCCEEDED, f"pid {handle.pid} still serving")
    return True


async def clear_leftovers(sup: Supervisor, op: Operation, members: set[int]) -> None:
    """stopped -> stopping -> releasing -> stopped for processes an earlier daemon left
    (``stop_and_release``; raises ``StartFailed`` when they could not be released).

    No baseline exists yet, so release here means: no member pid on any managed GPU
    (``stop_and_release``'s rule for GPUs without a baseline).
    """
    sup.baseline = {}  # none measured yet (measure_baseline comes next)
    reason = f"leftover processes of this instance: {sorted(members)}"
    if not await stop_and_release(sup, op, reason, S.STOPPED, prefix=PhasePrefix.LEFTOVERS):
        raise StartFailed(f"leftovers could not be cleared: {sup.state_reason}")
    if not sup.probe.pids_are_local():
        # Without local pids the GPUs cannot tell us the leftovers are gone, and the
        # baseline measured next may include what they held: say so.
        sup.warn(
            f"leftovers {sorted(members)} were torn down, but with GPU pids from another "
            "PID namespace their release could not be verified on the GPUs"
        )


async def measure_baseline(sup: Supervisor) -> None:
    """GPU memory in use with nothing of ours running (foreign processes included:
    release waits for *our* memory only)."""
    try:
        samples = await asyncio.to_thread(sup.probe.sample, sup.gpu_indices())
    except GpuQueryError as exc:
        raise StartFailed(f"cannot read the managed GPUs: {exc}") from exc
    sup.baseline = {s.index: s.memory_used_bytes for s in samples}
    sup.journal.record_baseline(sup.baseline)
