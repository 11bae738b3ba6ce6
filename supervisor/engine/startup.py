"""Start-up: the persisted state, the live schema, the managed GPUs; then the initial
start operation: adopt the server an earlier daemon left running, or clear leftovers of
ours, measure the GPU baseline, report an interrupted apply and launch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from sglang_supervisor.engine import persisted as persisted_levers
from sglang_supervisor.engine import routing
from sglang_supervisor.engine.boundaries import Cancelled, StartFailed, checkpoint
from sglang_supervisor.engine.checks import refuse_if_foreign
from sglang_supervisor.engine.desired import levers_to_start
from sglang_supervisor.engine.parts import Parts, SchemaFacts
from sglang_supervisor.engine.probation import watch_probation
from sglang_supervisor.engine.record import ServerInfo, ServerRecord
from sglang_supervisor.engine.release import members_now, stop_and_release, teardown
from sglang_supervisor.engine.rollback import roll_back
from sglang_supervisor.engine.server import judge_hung, launch_until_ready, wait_ready
from sglang_supervisor.engine.sglang_info import after_schema
from sglang_supervisor.engine.start_retry import RETRY_WHAT
from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.engine.transaction import commit, recover
from sglang_supervisor.engine.validation import check_sglang, gpu_facts, warm_resolution
from sglang_supervisor.host.backend import ServerHandle
from sglang_supervisor.host.gpu import (
    GpuInfo,
    GpuProbe,
    GpuQueryError,
    resolve_gpus,
)
from sglang_supervisor.operations import FAILED, ROLLED_BACK, SUCCEEDED, Operation
from sglang_supervisor.phases import PhaseName, PhasePrefix, prefixed
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.states import ServerState
from sglang_supervisor.store import RecordedServer

log = logging.getLogger("supervisor")
S = ServerState


async def prepare(parts: Parts, record: ServerRecord, stop: StopRequest) -> asyncio.Task[None]:
    """Read the state, the live schema (learned here, once) and the GPUs; choose the
    levers to start with. Returns start-up's check of the SGLang that answers
    validation (its resolution helper imports it: seconds), still running.

    Raises ``ValueError`` (bad config: unknown GPU, invalid initial levers) before
    anything is started.
    """
    record.loading_now(f"the state in {parts.journal.dir}")
    persisted = await parts.journal.load()
    if persisted.crashes is not None:
        # The restarts and the crash-loop window go on across daemons (an adopted server
        # that crashes with its daemon would otherwise never reach the loop limit).
        c, now = persisted.crashes, parts.clock()
        ago = [time.time() - float(t) for t in c["recent"]]
        record.crashes_restored(c["restarts"], c["by_reason"], [now - a for a in ago], now)
    if parts.schema_loader is not None:
        record.loading_now(
            f"SGLang's flag schema from {parts.settings.server.python} (imports SGLang the "
            "first time: seconds)"
        )
        loaded = await asyncio.to_thread(
            parts.schema_loader, parts.settings.server.python, parts.journal.dir / "schema-cache"
        )
        parts.learned.learn(SchemaFacts(loaded.schema, loaded.live, loaded.warning))
        if loaded.warning:
            log.warning("%s", loaded.warning)
            record.warn(loaded.warning)
    record.loading_now("the managed GPUs")
    managed = await asyncio.to_thread(resolve_managed, parts.probe, parts.settings.server.gpus)
    record.gpus_resolved(managed)
    record.loading_now("the levers to start with")
    # Persisted levers were checked against the SGLang of their day: check them again
    # against this one (an upgrade may have renamed a flag); misfits are kept, not lost.
    choice = await persisted_levers.choose(parts, record, persisted)
    # The persisted set, else the config's; with levers_source = "config" the config's.
    initial = levers_to_start(
        parts.desired.view(),
        parts.schema,
        choice.levers,
        adopting=parts.journal.recorded.server is not None,
        warn=record.warn,
    )
    record.chose_levers(initial, choice.last_good)
    gpus_known = gpu_facts(parts, record.managed) is not None
    record.sglang_learned(
        after_schema(
            parts.schema.sglang_version, parts.schema_live, parts.schema_warning, gpus_known
        )
    )
    await warm_resolution(parts, record)
    # Which SGLang answers, and whether its resolution can run, once its helper has
    # imported it (seconds): /status says "checking" meanwhile.
    check = asyncio.create_task(check_sglang(parts, record, stop))
    record.loading_now(None)
    if not parts.probe.pids_are_local():
        record.warn(
            "GPU process ids come from another PID namespace (a container without the "
            "host's PID namespace): membership by pid is impossible, so release is "
            "decided by GPU memory alone"
        )
    return check


def resolve_managed(probe: GpuProbe, names: list[str]) -> list[GpuInfo]:
    """The managed GPUs: those named (index or UUID), or every GPU the probe sees."""
    return resolve_gpus(probe, names or [str(d.index) for d in probe.devices()])


async def initial_start(
    parts: Parts, record: ServerRecord, stop: StopRequest, op: Operation
) -> None:
    """Adopt the recorded server if it is healthy; else clear leftovers and launch."""
    persisted = parts.journal.recorded
    recorded = persisted.server
    # An operator's stop that the last daemon did not finish (it died mid-stop) is
    # finished, not undone: its server is torn down with the leftovers below.
    if (
        recorded is not None
        and persisted.stopped_by is None
        and await try_adopt(parts, record, stop, op, recorded)
    ):
        return
    if recorded is not None and parts.desired.source == "config":
        # The recorded server was not adopted (gone after a reboot, or stopped): only an
        # adoption keeps its levers, so the file's win here as at any start (prepare).
        levers = levers_to_start(
            parts.desired.view(), parts.schema, record.levers, adopting=False, warn=record.warn
        )
        record.chose_levers(levers, record.last_good)
    # Leftovers of an earlier daemon (same instance tag) go first, so the baseline is
    # measured with nothing of ours on the GPUs.
    members = await asyncio.to_thread(members_now, parts, record)
    try:
        if members:
            await clear_leftovers(parts, record, stop, op, members)
        await measure_baseline(parts, record)
    except StartFailed as exc:
        nothing_runs(record, f"not started: {exc}")
        op.finish(FAILED, str(exc))
        return
    try:
        checkpoint(stop, op)
    except Cancelled as exc:
        if exc.shutdown:
            raise
        # An operator's cancel before anything started: a stop as well, and it holds.
        await parts.journal.record_operator_stop(op.id)
        why = f"{exc}: nothing was started and the server stays stopped; POST /start to start it"
        nothing_runs(record, why)
        op.finish(FAILED, why)
        return
    if persisted.stopped_by is not None:
        why = (
            f"not started: an operator stopped the server (operation {persisted.stopped_by}) "
            "before the daemon restarted; POST /start to start it"
        )
        nothing_runs(record, why)
        op.phase(PhaseName.START).end(SUCCEEDED, why)
        op.finish(SUCCEEDED)
        return
    if await refuse_if_foreign(parts, record, op):
        why = f"{op.error}; the start is retried ({RETRY_WHAT})"
        nothing_runs(record, why)  # loading -> stopped
        record.start_refused(why)
        return
    # levers_source = "config": the file's levers may not be the last-good set. Untested,
    # they start as an apply's do: on probation, and failing, the last-good levers come
    # back (a retry of levers that never served would end in a crash loop, nothing up).
    untested = record.last_good is not None and record.levers != record.last_good
    pending = persisted.pending_operation
    if pending is not None:
        op.phase(PhaseName.INTERRUPTED_APPLY).end(
            ROLLED_BACK,
            f"apply {pending.get('id')} was interrupted by the daemon's exit; "
            + (
                'starting the config file\'s levers (levers_source = "config"), on probation'
                if untested
                else "starting the last-good levers"
            ),
        )
        await parts.journal.clear_pending(save=False)
    if not await launch_until_ready(parts, record, stop, op, record.levers, probation=untested):
        why = op.rollback_reason or "the initial start failed"
        if op.cancelled is not None:
            await cancelled_start_up(parts, record, stop, op)
        elif untested:
            await roll_back(
                parts,
                record,
                stop,
                op,
                f'the config\'s levers (levers_source = "config") failed at start: {why}; '
                "fix [server.levers]/[server.env], then SIGHUP (systemctl reload)",
            )
        else:
            await recover(parts, record, stop, op, why)
        return
    await routing.join(parts, record, op)
    await commit(parts, record, op, record.levers)


def nothing_runs(record: ServerRecord, why: str) -> None:
    """Start-up found nothing of ours running and starts nothing: loading -> stopped
    (after torn-down leftovers the state is stopped already)."""
    if record.state == S.LOADING:
        record.transition(S.STOPPED, why)


async def cancelled_start_up(
    parts: Parts,
    record: ServerRecord,
    stop: StopRequest,
    op: Operation,
    what: str = "the start-up launch",
) -> None:
    """An operator cancelled the daemon's start-up while it launched ``what`` or adopted
    it (a server an earlier daemon left, still loading): that is a stop, not a crash.
    Recorded as an operator's stop before anything is stopped, so it holds across daemon
    restarts as after ``POST /stop``; torn down, stopped, said; nothing is relaunched."""
    why = (
        f"{op.cancelled}: {what} was torn down and the server stays stopped; "
        "POST /start to start it"
    )
    await parts.journal.record_operator_stop(op.id)
    if await stop_and_release(parts, record, stop, op, why, S.STOPPED, prefix=PhasePrefix.CLEANUP):
        op.levers_effective = None
        op.finish(FAILED, why)
    else:
        op.finish(FAILED, f"{why}; then the server could not be released: {record.state_reason}")


async def try_adopt(
    parts: Parts, record: ServerRecord, stop: StopRequest, op: Operation, recorded: RecordedServer
) -> bool:
    """Keep a server an earlier daemon left running, if it is healthy: no reload.

    Adopted when its launcher (same pid *and* create time) answers /health_generate,
    or is still starting with the last-good levers. A server of an interrupted apply
    that is not ready yet is torn down instead (the last-good levers start).
    """
    handle = await asyncio.to_thread(
        parts.procs.adopt, recorded.pid, recorded.create_time, recorded.tag, Path(recorded.log_path)
    )
    if handle is None:
        return False
    levers = LeverSet.from_json(recorded.levers)
    pending = parts.journal.recorded.pending_operation or {}
    if pending.get("path") in ("live", "weights"):
        # Changed in place when the daemon died: which values it serves is not known.
        log.warning(
            "not adopting pid %s: apply %s was changing it in place (%s) when the daemon "
            "exited; the last-good levers start instead",
            recorded.pid,
            pending.get("id"),
            pending.get("path"),
        )
        return False
    probe = await parts.health.generate_ok(parts.url, 5.0)
    interrupted_apply = record.last_good is not None and levers != record.last_good
    if interrupted_apply and not probe.ok:
        return False
    ph = op.phase(PhaseName.ADOPT)
    others = await asyncio.to_thread(
        parts.procs.members, None, tag=None, tag_prefix=parts.tag_prefix, exclude_tag=recorded.tag
    )
    if others:
        report = await teardown(parts, stop, None, exclude_tag=recorded.tag)
        op.phase(prefixed(PhasePrefix.LEFTOVERS, PhaseName.STOP)).end(
            SUCCEEDED if report.clean else FAILED, f"other launches: {report.describe()}"
        )
    if parts.journal.recorded.baseline is not None:
        record.baseline_measured(parts.journal.recorded.baseline)
    else:
        record.baseline_measured({g.index: 0 for g in record.managed})
        record.warn("no recorded GPU baseline: release is judged against 0 bytes + tolerance")
    record.server_started(ServerInfo(handle=handle, levers=levers))
    record.transition(
        S.STARTING,
        f"adopting pid {recorded.pid} (launch {recorded.tag}) left running by an earlier daemon",
    )
    try:
        if not probe.ok and recorded.ready:
            await judge_hung(parts, stop, op, handle, probe.detail)
        await wait_ready(parts, record, stop, op, handle, timed=False)
    except StartFailed as exc:
        ph.end(FAILED, str(exc))
        await recover(parts, record, stop, op, str(exc))
        return True
    except Cancelled as exc:  # an operator would rather act than wait for it
        if exc.shutdown:
            raise
        ph.end(FAILED, str(exc))
        await cancelled_start_up(
            parts, record, stop, op, f"the adopted server (pid {recorded.pid})"
        )
        return True
    ph.end(SUCCEEDED, f"pid {recorded.pid} adopted: no restart, levers {levers.digest()}")
    if interrupted_apply and not await finish_probation(parts, record, stop, op, handle):
        return True
    await routing.join(parts, record, op)  # make sure the router lists it (a no-op when it does)
    if record.last_good is None or interrupted_apply:
        # The interrupted apply had reached ready and passed its probation: finish it.
        await commit(parts, record, op, levers)
    else:
        await parts.journal.clear_pending()
        op.levers_effective = levers.to_json()
        op.finish(SUCCEEDED)
    return True


async def finish_probation(
    parts: Parts, record: ServerRecord, stop: StopRequest, op: Operation, handle: ServerHandle
) -> bool:
    """The interrupted apply's server is ready, but its probation never ended: watch it
    for the whole window now; untested levers never become last-good. On a failure or an
    operator's cancel, roll back to the last-good levers and clear the pending apply
    (False)."""
    if parts.settings.timeouts.probation_s <= 0:
        return True
    ph = op.phase(PhaseName.PROBATION)
    try:
        await watch_probation(parts, record, stop, op, handle)
    except StartFailed as exc:
        ph.end(FAILED, str(exc))
        await roll_back(
            parts, record, stop, op, f"the interrupted apply's new server failed probation: {exc}"
        )
        await parts.journal.clear_pending()
        return False
    except Cancelled as exc:
        if exc.shutdown:
            raise
        # Cancelled like any apply's probation, whoever started it: the untested levers
        # are rolled back and the pending apply cleared (else the next daemon commits them).
        ph.end(FAILED, f"{exc} while pid {handle.pid} was in probation")
        await roll_back(parts, record, stop, op, f"the interrupted apply's probation: {exc}")
        await parts.journal.clear_pending()
        return False
    ph.end(SUCCEEDED, f"pid {handle.pid} still serving")
    return True


async def clear_leftovers(
    parts: Parts, record: ServerRecord, stop: StopRequest, op: Operation, members: set[int]
) -> None:
    """stopped -> stopping -> releasing -> stopped for processes an earlier daemon left
    (``stop_and_release``; raises ``StartFailed`` when they could not be released).

    No baseline exists yet, so release here means: no member pid on any managed GPU
    (``stop_and_release``'s rule for GPUs without a baseline).
    """
    record.baseline_measured({})  # none measured yet (measure_baseline comes next)
    reason = f"leftover processes of this instance: {sorted(members)}"
    if not await stop_and_release(
        parts, record, stop, op, reason, S.STOPPED, prefix=PhasePrefix.LEFTOVERS
    ):
        raise StartFailed(f"leftovers could not be cleared: {record.state_reason}")
    if not parts.probe.pids_are_local():
        # Without local pids the GPUs cannot tell us the leftovers are gone, and the
        # baseline measured next may include what they held: say so.
        record.warn(
            f"leftovers {sorted(members)} were torn down, but with GPU pids from another "
            "PID namespace their release could not be verified on the GPUs"
        )


async def measure_baseline(parts: Parts, record: ServerRecord) -> None:
    """GPU memory in use with nothing of ours running (foreign processes included:
    release waits for *our* memory only)."""
    try:
        samples = await asyncio.to_thread(parts.probe.sample, record.gpu_indices())
    except GpuQueryError as exc:
        raise StartFailed(f"cannot read the managed GPUs: {exc}") from exc
    record.baseline_measured({s.index: s.memory_used_bytes for s in samples})
    parts.journal.record_baseline(dict(record.baseline))
