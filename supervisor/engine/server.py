"""One server launch: spawn it until ready, watch its probation, explain its exit (its
stop and the verified release of its GPUs: ``engine.release``).

Every OS step (spawn, teardown, the release wait) runs in a worker thread and is never
cancelled midway: a shutdown or an operator's cancel is noticed at the next phase
boundary (``checkpoint``) or at the next poll of a wait, never inside a step.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from sglang_supervisor import diskspace
from sglang_supervisor.config import ServerSettings
from sglang_supervisor.engine import ownership
from sglang_supervisor.engine.boundaries import (
    Cancelled,
    StartFailed,
    checkpoint,
    exit_reason,
    pause,
)
from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.probation import watch_probation
from sglang_supervisor.engine.record import ServerInfo, ServerRecord
from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.host.backend import ServerHandle
from sglang_supervisor.host.gpu import GpuInfo, cuda_visible_devices
from sglang_supervisor.host.secretflags import config_flags, split_secrets
from sglang_supervisor.host.serverenv import (
    CACHE_VAR,
    server_environ,
    sglang_cache_dir,
    with_cache_dir,
)
from sglang_supervisor.observe import serverlogs
from sglang_supervisor.observe.telemetry import tail_lines
from sglang_supervisor.operations import FAILED, SUCCEEDED, Operation
from sglang_supervisor.phases import PhaseName
from sglang_supervisor.sglang import auth
from sglang_supervisor.sglang.accesslog import probe_log_flags
from sglang_supervisor.sglang.auth import ServerKeys
from sglang_supervisor.sglang.levers import LeverSet, render_argv
from sglang_supervisor.sglang.schema import FlagSchema
from sglang_supervisor.states import ServerState
from sglang_supervisor.store import StoreError

log = logging.getLogger("supervisor")
S = ServerState


# ---------------------------------------------------------------------- launch


def flags(parts: Parts, levers: LeverSet) -> list[str]:
    """The server's flags: the levers, then the ones the supervisor owns."""
    return launch_flags(levers, parts.schema, parts.settings.server)


def launch_flags(levers: LeverSet, schema: FlagSchema, server: ServerSettings) -> list[str]:
    """``flags`` from what it reads (safe in a worker thread)."""
    owned = ["--host", server.host, "--port", str(server.port), "--enable-metrics"]
    # The daemon's probes stay out of SGLang's access log unless the levers say otherwise.
    return [*render_argv(levers, schema), *probe_log_flags(levers.levers, schema), *owned]


def launch_argv(parts: Parts, levers: LeverSet) -> list[str]:
    """The server's command line. A local launch takes its secret levers from a
    ``--config`` file, never its argv (``host.secretflags``); a Slurm step keeps them
    on its command line. Blocking (it writes that file): call it from a worker thread.
    Raises ``StoreError`` when the file cannot be written."""
    if parts.settings.server.launcher != "local":
        return [*parts.backend.command, *flags(parts, levers)]
    public, secret = split_secrets(levers)
    from_file = config_flags(parts.settings.state_dir, secret, parts.schema)
    return [*parts.backend.command, *from_file, *flags(parts, public)]


def server_env(parts: Parts, managed: Sequence[GpuInfo], levers: LeverSet) -> dict[str, str]:
    """The server's environment: the daemon's (less its own settings), the backend's,
    the levers', and the managed GPUs by UUID."""
    env = server_environ(os.environ, parts.settings.state_dir)
    env.update(parts.backend.env)
    env.update(levers.env)
    env.update(cuda_visible_devices(list(managed))[1])
    # What a launch compiles is kept for the next (unless the operator's env says where).
    return with_cache_dir(env, cache_dir(parts))


def serving_cache_dir(parts: Parts, levers: LeverSet) -> Path:
    """The SGLANG_CACHE_DIR a launch of ``levers`` gets (``with_cache_dir``'s choice)."""
    given = (
        levers.env.get(CACHE_VAR) or parts.backend.env.get(CACHE_VAR) or os.environ.get(CACHE_VAR)
    )
    return Path(given).expanduser() if given else cache_dir(parts)


def cache_dir(parts: Parts) -> Path:
    """The SGLANG_CACHE_DIR the daemon gives the server unless the environment sets one."""
    s = parts.settings
    return sglang_cache_dir(s.server.sglang_cache_dir, s.state_dir)


async def launch_until_ready(
    parts: Parts,
    record: ServerRecord,
    stop: StopRequest,
    op: Operation,
    levers: LeverSet,
    *,
    probation: bool,
    phase: str = PhaseName.START,
) -> bool:
    """starting -> ready (+ probation). On failure the server is left for the caller to
    tear down, and ``op.rollback_reason`` / ``op.log_tail`` say why; an operator's cancel
    is such a failure. Raises ``Cancelled`` on a shutdown (the launch is recorded, so the
    shutdown's own teardown finds it)."""
    ph = op.phase(phase)
    handle: ServerHandle | None = None
    try:
        checkpoint(stop, op)
        tag = f"{parts.tag_prefix}{uuid.uuid4().hex[:12]}"
        # Microseconds in the name keep launches in order even within one second.
        now = time.time()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f".{int(now % 1 * 1e6):06d}"
        log_path = parts.journal.logs_dir / f"server-{stamp}-{tag.rsplit('.', 1)[-1]}.log"
        # The levers being launched live in record.server; record.levers changes only at commit.
        record.transition(S.STARTING, f"{op.kind} {op.id}: levers {levers.digest()}")
        await asyncio.to_thread(
            serverlogs.prune, parts.journal.logs_dir, parts.settings.server.log_keep_launches - 1
        )
        taken = await ownership.port_taken(parts, record)
        if taken is not None:
            op.rollback_reason = taken
            ph.end(FAILED, taken)
            return False
        try:
            argv = await asyncio.to_thread(launch_argv, parts, levers)
            handle = await asyncio.to_thread(
                parts.procs.spawn,
                argv,
                server_env(parts, record.managed, levers),
                tag=tag,
                log_path=log_path,
            )
        except (OSError, StoreError) as exc:
            op.rollback_reason = str(exc)
            ph.end(FAILED, str(exc))
            return False
        # Recorded before anything else can happen: a shutdown's teardown finds it.
        record.server_started(ServerInfo(handle=handle, levers=levers))
        await parts.journal.record_launch(handle, levers)
        parts.events.publish("launch", operation=op.id, pid=handle.pid, tag=tag, log=str(log_path))
        await wait_ready(parts, record, stop, op, handle)
        ph.end(SUCCEEDED, f"pid {handle.pid} ready")
        if probation and parts.settings.timeouts.probation_s > 0:
            ph = op.phase(PhaseName.PROBATION)
            await watch_probation(parts, record, stop, op, handle)
            ph.end(SUCCEEDED, f"pid {handle.pid} still serving")
    except StartFailed as exc:
        op.rollback_reason = str(exc)
        if handle is not None:
            op.log_tail = await asyncio.to_thread(tail_lines, handle.log_path, 30)
            # A server that cannot write exits 1 with an empty log: name the full disk.
            full = await asyncio.to_thread(diskspace.full_disk_note, handle.log_path)
            if full is not None:
                op.rollback_reason = f"{exc}; {full}"
            # A launcher that spans nodes looks at them again: a GPU taken since the
            # preflight is named with its node and pid (supervisor/slurm/launcher.py).
            explain = getattr(parts.procs, "start_failure_note", None)
            note = None if explain is None else await asyncio.to_thread(explain, handle)
            if note:
                op.rollback_reason += f"; {note}"
        ph.end(FAILED, op.rollback_reason)
        return False
    except Cancelled as exc:
        if exc.shutdown:
            ph.end(FAILED, f"interrupted: {exc}")
            raise
        op.rollback_reason = str(exc)
        if handle is not None:  # a sentence, not a phase name pasted in ("was start")
            doing = "in probation" if ph.name.endswith(PhaseName.PROBATION) else "starting"
            op.rollback_reason += f" while pid {handle.pid} was {doing}"
        ph.end(FAILED, op.rollback_reason)
        return False
    return True


async def wait_ready(
    parts: Parts,
    record: ServerRecord,
    stop: StopRequest,
    op: Operation,
    handle: ServerHandle,
    *,
    timed: bool = True,
) -> None:
    """starting -> ready once /health_generate answers 200. Raises ``StartFailed`` when
    the launcher exits or ``ready_timeout_s`` passes; ``Cancelled`` at the next poll after
    a cancel or shutdown request. ``timed``: the wait began at the spawn, so it measures
    the server's start (an adopted server's does not)."""
    t = parts.settings.timeouts
    t0 = parts.clock()
    deadline = t0 + t.ready_timeout_s
    impostor: str | None = None  # who answered 200 without being this launch
    vanished: str | None = None  # a 200 whose listener had exited by the time we looked
    while True:
        if handle.poll():
            why = await exit_reason(handle, "during start")
            if impostor is not None:
                why += f"; meanwhile /health_generate was answered by another process: {impostor}"
            raise StartFailed(why)
        checkpoint(stop, op)
        remaining = deadline - parts.clock()
        if remaining <= 0:
            if impostor is not None:
                raise StartFailed(
                    f"not ready after {t.ready_timeout_s:g}s (ready_timeout_s): "
                    f"/health_generate answered 200, but not from this launch: {impostor}"
                )
            if vanished is not None:
                raise StartFailed(
                    f"not ready after {t.ready_timeout_s:g}s (ready_timeout_s): "
                    f"/health_generate answered 200, but {vanished}; pid {handle.pid} was "
                    "still running"
                )
            raise StartFailed(
                f"not ready after {t.ready_timeout_s:g}s (ready_timeout_s): "
                f"/health_generate never answered 200; pid {handle.pid} was still running"
            )
        probe = await parts.health.generate_ok(parts.url, min(5.0, max(0.5, remaining)))
        if probe.ok:
            # A 200 counts only from a listener of this launch (another process on the
            # port would answer for a launch whose own bind failed). A listener that has
            # exited since is nobody's: the next poll sees whether it was this launch.
            found = await ownership.listeners_of(parts, record, handle)
            if found.ours:
                # A cancel accepted while this probe ran is honoured here, not dropped:
                # nothing after this point of a start would notice it.
                if op.cancel_requested is not None:
                    checkpoint(stop, op)
                break
            where = parts.settings.server
            text = found.describe(where.host, where.port, handle.pid)
            if found.foreign:
                impostor = text
            else:
                vanished = text
        # Probing often keeps the lag between "ready" and noticing it short; after the
        # first 10 s (a real model load takes minutes) a tenth of the rate is enough.
        interval = t.readiness_poll_s if parts.clock() - t0 < 10 else t.readiness_poll_s * 10
        await pause(stop, op, min(interval, parts.poll_s * 5))
    info: dict[str, Any] = {}
    try:
        # /server_info is one of SGLang's normal routes: the server's api_key, if any.
        keys = ServerKeys.of(record.server.levers.levers) if record.server else ServerKeys()
        bearer = auth.headers(keys, "GET", "/server_info")
        info = await parts.health.server_info(parts.url, 5.0, bearer)
    except (httpx.HTTPError, OSError, ValueError) as exc:
        # Only a figure for /status is missing; a bug (TypeError...) is not hidden.
        log.warning("pid %s is ready, but /server_info did not answer: %s", handle.pid, exc)
    tokens = info.get("max_total_num_tokens")
    # A new server is ready: the watcher counts its liveness afresh (it tracks the server).
    record.server_ready(
        int(tokens) if isinstance(tokens, (int, float)) else None,
        start_s=parts.clock() - t0 if timed else None,
    )
    record.transition(
        S.READY, f"pid {handle.pid} answered /health_generate after {parts.clock() - t0:.1f}s"
    )
    await parts.journal.record_ready()


async def judge_hung(
    parts: Parts, stop: StopRequest, op: Operation, handle: ServerHandle, detail: str
) -> None:
    """A server that had been ready does not answer now (found at a daemon's start-up):
    hung or only busy? The liveness rules decide — ``liveness_failures`` failed probes in
    a row, ``liveness_interval_s`` apart — not a start's whole ``ready_timeout_s``.
    Returns once it answers; raises ``StartFailed`` (hung) or ``Cancelled``."""
    t = parts.settings.timeouts
    failures = 1  # the probe that found it not answering
    while failures < t.liveness_failures:
        await pause(stop, op, t.liveness_interval_s)
        if handle.poll():
            raise StartFailed(await exit_reason(handle, "while being adopted"))
        probe = await parts.health.generate_ok(parts.url, t.liveness_timeout_s)
        if probe.ok:
            return
        failures += 1
        detail = probe.detail
    raise StartFailed(
        f"hung: pid {handle.pid} had been ready but failed {failures} liveness probes in a "
        f"row at adoption (last: {detail})"
    )
