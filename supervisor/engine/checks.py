"""Everything knowable before the stop but validation (``engine.validation``): preflight
of the host's resources, the one rule of "busy", processes that are not ours on the
managed GPUs, the router's answer and the no-op apply. Nothing here changes anything.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sglang_supervisor.engine.errors import Busy
from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ReadRecord, ServerRecord
from sglang_supervisor.engine.release import members_now
from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.engine.validation import not_run_of, validate_with_sglang
from sglang_supervisor.host import preflight as host_preflight
from sglang_supervisor.host.gpu import (
    FOREIGN_ADVICE,
    GpuInfo,
    GpuQueryError,
    GpuSample,
    foreign_holders,
)
from sglang_supervisor.operations import FAILED, SUCCEEDED, Operation, Phase
from sglang_supervisor.phases import OpKind, PhaseName
from sglang_supervisor.planner import PlanError, load_model_dir
from sglang_supervisor.planner.hostpool import DevicePool
from sglang_supervisor.planner.inputs import lever_bool, lever_float
from sglang_supervisor.sglang.levers import (
    LeverError,
    LeverProblem,
    LeverSet,
)
from sglang_supervisor.sglang.router import RouterError
from sglang_supervisor.states import IDLE_STATES, ServerState
from sglang_supervisor.units import MiB, fmt_mib

log = logging.getLogger("supervisor")
S = ServerState


async def before_the_stop(
    parts: Parts, record: ServerRecord, requested: LeverSet, op: Operation
) -> tuple[LeverSet, dict[str, Any], list[dict[str, str]]]:
    """Validate, then preflight ``requested``, each as a phase of ``op`` timed as it runs
    (``op`` is not yet registered: a refusal leaves nothing behind). Returns the
    canonical set, the values SGLang's own resolution picked (empty when it could not
    run) and the checks that did not run (``[{"check", "reason"}]``). Raises
    ``LeverError`` naming every problem (nothing was touched)."""
    ph, t0 = op.phase(PhaseName.VALIDATE), time.monotonic()
    try:
        checked, validate_detail, verdict = await validate_with_sglang(parts, record, requested)
    except LeverError as exc:
        ph.end(FAILED, str(exc))
        raise
    _passed(ph, t0, validate_detail)
    ph, t0 = op.phase(PhaseName.PREFLIGHT), time.monotonic()
    problems = await preflight(parts, record, checked)
    if problems:
        ph.end(FAILED, "; ".join(f"{p.lever}: {p.message}" for p in problems))
        raise LeverError(problems)
    _passed(ph, t0, "GPUs, host RAM, port, model path")
    resolved = {} if verdict is None else dict(verdict.resolved)
    return checked, resolved, not_run_of(parts, verdict)


def _passed(ph: Phase, t0: float, detail: str) -> None:
    ph.duration_s = took = time.monotonic() - t0
    ph.end(SUCCEEDED, f"{detail} ({took * 1000:.1f} ms)")


#: The operations that retry a failed launch after a backoff (``transaction.recover``):
#: a recovery, and the daemon's start-up (its launch crash-looping is one too).
RETRYING = frozenset({OpKind.RECOVER, OpKind.START})


def backing_off(current: Operation | None, record: ReadRecord) -> bool:
    """The running operation (``current``) is a recovery — or the start-up's retries of
    its launch — that only waits out its backoff (no OS step runs): an operator's
    request may end it. A start-up that crash-loops on the config's levers yields to a
    reconcile of the edited config (it was refused as busy for the whole loop)."""
    return current is not None and current.kind in RETRYING and record.state == S.BACKOFF


def refuse_if_busy(stop: StopRequest, current: Operation | None, record: ReadRecord) -> None:
    """The one rule of "busy" for an operator's request: raises ``Busy`` while the daemon
    closes, or while an operation runs — unless it is a recovery only backing off, which
    yields to the request (once the request has been found valid)."""
    if stop.requested:
        raise Busy(Operation(kind=OpKind.SHUTDOWN))
    if current is not None and not current.finished and not backing_off(current, record):
        raise Busy(current)


async def before_a_relaunch(
    parts: Parts, record: ReadRecord, stop: StopRequest, current: Operation | None
) -> None:
    """Everything knowable before a start or restart of the current levers is checked
    before anything is stopped: busy, then the same preflight an apply runs (a foreign
    process on a GPU, host RAM, the port). Raises ``Busy`` or ``LeverError``."""
    refuse_if_busy(stop, current, record)
    problems = await preflight(parts, record, record.levers)
    if problems:
        raise LeverError(problems)


async def preflight(parts: Parts, record: ReadRecord, levers: LeverSet) -> list[LeverProblem]:
    """Resource problems of ``levers`` on this host (empty: it can start)."""
    if parts.backend.name == "sglang" and not parts.schema_live:
        return [
            LeverProblem(
                "server.python",
                f"{parts.settings.server.python} cannot run SGLang ({parts.schema_warning}); "
                "install SGLang there or fix server.python",
            )
        ]
    try:
        samples, members = await asyncio.to_thread(sample_with_members, parts, record)
    except GpuQueryError as exc:
        return [LeverProblem("gpus", f"cannot query the managed GPUs: {exc}")]
    running = record.state not in IDLE_STATES
    freed = 0
    # psutil's available RAM and the cgroup limits: /proc and /sys reads, off the loop.
    host = await asyncio.to_thread(
        host_preflight.host_facts, parts.backend.simulated_host_ram_bytes
    )
    pool = await asyncio.to_thread(device_pool, parts, record.managed, levers)
    server = record.server  # read once: a stop may end it while the pool is computed
    if running and server is not None:
        # What the running server's host pool frees at the stop, by SGLang's own sizing rule.
        gpu_total = min((g.memory_total_bytes for g in record.managed), default=0)
        running_pool = await asyncio.to_thread(device_pool, parts, record.managed, server.levers)
        host, freed = host_preflight.running_host_pool(
            server.levers.levers, gpu_total, host, running_pool
        )
    problems = await asyncio.to_thread(
        state_dir_problems, parts.journal.dir, parts.journal.logs_dir
    )
    # A launcher that spans nodes checks what its nodes need (supervisor/slurm/launcher.py).
    node_check = getattr(parts.procs, "preflight_problems", None)
    if node_check is not None:
        found = await asyncio.to_thread(node_check, levers.levers, members)
        problems += [LeverProblem(lever, message) for lever, message in found]
    return problems + await asyncio.to_thread(
        host_preflight.check,
        levers,
        managed=record.managed,
        samples=samples,
        member_pids=members,
        pids_are_local=parts.probe.pids_are_local(),
        host=host,
        freed_on_stop_bytes=freed,
        server_host=parts.settings.server.host,
        server_port=parts.settings.server.port,
        port_is_ours=running,
        device_pool=pool,
        server_cwd=parts.settings.server.cwd,
    )


def device_pool(parts: Parts, managed: Sequence[GpuInfo], levers: LeverSet) -> DevicePool | None:
    """One rank's device KV pool for ``levers`` when an explicit ``hicache_ratio`` needs
    it (SGLang sizes that host pool as a multiple of it), from the model the server would
    load: the backend's own (the simulated server's) or the local model directory's
    config.json; None when the model is unknown here. Blocking: reads the directory."""
    lv = levers.levers
    if not lever_bool(lv, "enable_hierarchical_cache") or lever_float(lv, "hicache_ratio") is None:
        return None
    gpu_total = min((g.memory_total_bytes for g in managed), default=0)
    model_path = str(lv.get("model_path") or "")
    local = Path(model_path).expanduser()
    try:
        if parts.backend.plan_model is not None:
            env = {**os.environ, **parts.backend.env, **levers.env}
            model = parts.backend.plan_model(model_path, env)
        elif model_path and (local / "config.json").is_file():
            model = load_model_dir(local)
        else:
            return None
        return DevicePool.of(model, lv, gpu_total)
    except (PlanError, OSError, ArithmeticError, ValueError) as exc:
        log.warning("cannot size the device KV pool of %s for hicache_ratio: %s", model_path, exc)
        return None


def sample_with_members(parts: Parts, record: ReadRecord) -> tuple[list[GpuSample], set[int]]:
    """The managed GPUs and our member pids, scanned before *and* after the sample: a
    process of ours that exits or starts meanwhile (an operation is running) is never
    mistaken for a foreign one. Blocking; raises ``GpuQueryError``."""
    before = members_now(parts, record)
    samples = parts.probe.sample(record.gpu_indices())
    return samples, before | members_now(parts, record)


#: Free space the state directory's file system must keep: state.json and its previous
#: copy, the operation history and the server's logs (bounded, but growing meanwhile).
STATE_DIR_HEADROOM = 64 * MiB


def state_dir_problems(state_dir: Path, logs_dir: Path) -> list[LeverProblem]:
    """Whether the new levers could be persisted and the server's log kept: both
    directories take a write (and fsync), and the file system has ``STATE_DIR_HEADROOM``
    free. Blocking: call it from a worker thread."""
    for d in (state_dir, logs_dir):
        probe = d / f".preflight-{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"  # concurrent ones
        try:
            d.mkdir(parents=True, exist_ok=True)
            with open(probe, "xb") as f:  # O_EXCL: never through a planted link
                f.write(b"preflight")
                f.flush()
                os.fsync(f.fileno())
            probe.unlink()
        except OSError as exc:
            why = exc.strerror or str(exc)
            return [
                LeverProblem(
                    "state_dir",
                    f"{d} cannot be written ({why}): the new levers could not be persisted "
                    "nor the server's log kept; fix its permissions or mount",
                )
            ]
    free = shutil.disk_usage(state_dir).free
    if free < STATE_DIR_HEADROOM:
        return [
            LeverProblem(
                "state_dir",
                f"only {fmt_mib(free)} free on the file system of {state_dir} (at least "
                f"{fmt_mib(STATE_DIR_HEADROOM)} needed for the state and the server's log); "
                "free disk space",
            )
        ]
    return []


async def foreign_processes(parts: Parts, record: ReadRecord) -> str | None:
    """A description of processes that are not ours on the managed GPUs, or None.

    Raises ``GpuQueryError``: a failed query never reads as "no foreign process"."""
    if not parts.probe.pids_are_local():
        return None
    samples, members = await asyncio.to_thread(sample_with_members, parts, record)
    return "; ".join(foreign_holders(samples, members)) or None


async def refuse_if_foreign(parts: Parts, record: ReadRecord, op: Operation) -> bool:
    """Fail ``op`` (True) when a process that is not ours holds a managed GPU."""
    try:
        foreign = await foreign_processes(parts, record)
    except GpuQueryError as exc:
        why = f"not starting: the managed GPUs cannot be queried: {exc}"
    else:
        if foreign is None:
            return False
        why = f"not starting: {foreign}; {FOREIGN_ADVICE}, then POST /start"
    log.error("%s", why)
    op.phase(PhaseName.FOREIGN_PROCESSES).end(FAILED, why)
    op.finish(FAILED, why)
    return True


def serving_unchanged(record: ReadRecord, checked: LeverSet) -> bool:
    """Whether ``checked`` is exactly what the ready server serves (its launcher alive):
    an apply of it has nothing to change and restarts nothing."""
    server = record.server
    if record.state != S.READY or server is None or server.handle.poll():
        return False
    return not server.levers.diff(checked)


async def router_answers(parts: Parts, record: ServerRecord) -> None:
    """Before an apply stops anything: with ``[router]``, the router must answer its
    worker API, or the new server could never be added and the apply would roll back
    after two restarts for nothing. Raises ``LeverError`` naming the router and what it
    answered (the request's ``without_router`` skips this check)."""
    if not parts.router.enabled:
        return
    try:
        await parts.router.check()
    except RouterError as exc:
        record.router_answered(str(exc))
        raise LeverError(
            [
                LeverProblem(
                    "router",
                    f"{exc}; nothing was stopped. Fix the router ([router] url "
                    f"{parts.settings.router.url}), or apply with without_router: true "
                    "(CLI --without-router) to change the server anyway: it then serves "
                    "outside the router until the router takes it",
                )
            ]
        ) from exc
