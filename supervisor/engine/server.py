"""One server launch: spawn it until ready, watch its probation, explain its exit (its
stop and the verified release of its GPUs: ``engine.release``).

Every OS step (spawn, teardown, the release wait) runs in a worker thread and is never
cancelled midway: a shutdown or an operator's cancel is noticed at the next phase
boundary (``checkpoint``) or at the next poll of a wait, never inside a step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from sglang_supervisor import diskspace
from sglang_supervisor.engine import ownership
from sglang_supervisor.host.backend import ServerHandle
from sglang_supervisor.host.gpu import cuda_visible_devices
from sglang_supervisor.host.serverenv import server_environ
from sglang_supervisor.observe import serverlogs
from sglang_supervisor.observe.telemetry import tail_lines
from sglang_supervisor.operations import FAILED, SUCCEEDED, Operation, wall_iso
from sglang_supervisor.phases import PhaseName
from sglang_supervisor.sglang.levers import LeverSet, render_argv
from sglang_supervisor.states import ServerState

if TYPE_CHECKING:
    from sglang_supervisor.config import ServerSettings
    from sglang_supervisor.engine.supervisor import Supervisor
    from sglang_supervisor.sglang.schema import FlagSchema

log = logging.getLogger("supervisor")
S = ServerState


@dataclass
class ServerInfo:
    handle: ServerHandle
    levers: LeverSet
    started_at: str = field(default_factory=wall_iso)
    ready_at: str | None = None
    max_total_num_tokens: int | None = None


class StartFailed(Exception):
    """A launch did not become ready; the message says why (exit status, OOM, timeout)."""


class Cancelled(Exception):
    """A shutdown or an operator's cancel, noticed at a phase boundary."""

    def __init__(self, reason: str, *, shutdown: bool) -> None:
        super().__init__(reason)
        self.shutdown = shutdown


SHUTDOWN_REASON = "the daemon was shut down during the operation"


def checkpoint(sup: Supervisor, op: Operation) -> None:
    """A phase boundary: raise ``Cancelled`` when a shutdown or a cancel is pending.

    An operator's cancel is honoured once (``op.cancelled`` records it), so the rollback
    that follows runs to its end; a shutdown is honoured at every boundary.
    """
    if sup.stop_request.requested:
        raise Cancelled(SHUTDOWN_REASON, shutdown=True)
    reason = op.cancel_requested
    if reason is not None:
        op.cancel_requested = None
        op.cancelled = reason
        op.wake.clear()
        raise Cancelled(reason, shutdown=False)


async def pause(sup: Supervisor, op: Operation, seconds: float) -> None:
    """Sleep ``seconds``, ending early (``Cancelled``) on a shutdown or cancel request."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(op.wake.wait(), seconds)
    checkpoint(sup, op)


# ---------------------------------------------------------------------- launch


def flags(sup: Supervisor, levers: LeverSet) -> list[str]:
    """The server's flags: the levers, then the ones the supervisor owns."""
    return launch_flags(levers, sup.schema, sup.settings.server)


def launch_flags(levers: LeverSet, schema: FlagSchema, server: ServerSettings) -> list[str]:
    """``flags`` from its parts (no ``Supervisor``: safe in a worker thread)."""
    owned = ["--host", server.host, "--port", str(server.port), "--enable-metrics"]
    return [*render_argv(levers, schema), *owned]


def server_env(sup: Supervisor, levers: LeverSet) -> dict[str, str]:
    """The server's environment: the daemon's (less its own settings), the backend's,
    the levers', and the managed GPUs by UUID."""
    env = server_environ(os.environ, sup.settings.state_dir)
    env.update(sup.backend.env)
    env.update(levers.env)
    env.update(cuda_visible_devices(sup.managed)[1])
    return env


async def launch_until_ready(
    sup: Supervisor,
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
        checkpoint(sup, op)
        tag = f"{sup.tag_prefix}{uuid.uuid4().hex[:12]}"
        # Microseconds in the name keep launches in order even within one second.
        now = time.time()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f".{int(now % 1 * 1e6):06d}"
        log_path = sup.journal.logs_dir / f"server-{stamp}-{tag.rsplit('.', 1)[-1]}.log"
        # The levers being launched live in sup.server; sup.levers changes only at commit.
        sup.transition(S.STARTING, f"{op.kind} {op.id}: levers {levers.digest()}")
        await asyncio.to_thread(
            serverlogs.prune, sup.journal.logs_dir, sup.settings.server.log_keep_launches - 1
        )
        argv = [*sup.backend.command, *flags(sup, levers)]
        taken = await ownership.port_taken(sup)
        if taken is not None:
            op.rollback_reason = taken
            ph.end(FAILED, taken)
            return False
        try:
            handle = await asyncio.to_thread(
                sup.procs.spawn, argv, server_env(sup, levers), tag=tag, log_path=log_path
            )
        except OSError as exc:
            op.rollback_reason = str(exc)
            ph.end(FAILED, str(exc))
            return False
        # Recorded before anything else can happen: a shutdown's teardown finds it.
        sup.server = ServerInfo(handle=handle, levers=levers)
        await sup.journal.record_launch(handle, levers)
        sup.events.publish("launch", operation=op.id, pid=handle.pid, tag=tag, log=str(log_path))
        await wait_ready(sup, op, handle)
        ph.end(SUCCEEDED, f"pid {handle.pid} ready")
        if probation and sup.settings.timeouts.probation_s > 0:
            from sglang_supervisor.engine.probation import watch_probation  # it uses this module

            ph = op.phase(PhaseName.PROBATION)
            await watch_probation(sup, op, handle)
            ph.end(SUCCEEDED, f"pid {handle.pid} still serving")
    except StartFailed as exc:
        op.rollback_reason = str(exc)
        if handle is not None:
            op.log_tail = await asyncio.to_thread(tail_lines, handle.log_path, 30)
            # A server that cannot write exits 1 with an empty log: name the full disk.
            full = await asyncio.to_thread(diskspace.full_disk_note, handle.log_path)
            if full is not None:
                op.rollback_reason = f"{exc}; {full}"
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


async def wait_ready(sup: Supervisor, op: Operation, handle: ServerHandle) -> None:
    """starting -> ready once /health_generate answers 200. Raises ``StartFailed`` when
    the launcher exits or ``ready_timeout_s`` passes; ``Cancelled`` at the next poll after
    a cancel or shutdown request."""
    t = sup.settings.timeouts
    t0 = sup.clock()
    deadline = t0 + t.ready_timeout_s
    impostor: str | None = None  # who answered 200 without being this launch
    while True:
        if handle.poll():
            why = await exit_reason(handle, "during start")
            if impostor is not None:
                why += f"; meanwhile /health_generate was answered by another process: {impostor}"
            raise StartFailed(why)
        checkpoint(sup, op)
        remaining = deadline - sup.clock()
        if remaining <= 0:
            if impostor is not None:
                raise StartFailed(
                    f"not ready after {t.ready_timeout_s:g}s (ready_timeout_s): "
                    f"/health_generate answered 200, but not from this launch: {impostor}"
                )
            raise StartFailed(
                f"not ready after {t.ready_timeout_s:g}s (ready_timeout_s): "
                f"/health_generate never answered 200; pid {handle.pid} was still running"
            )
        probe = await sup.health.generate_ok(sup.url, min(5.0, max(0.5, remaining)))
        if probe.ok:
            # A 200 counts only from a listener of this launch (another process on the
            # port would answer for a launch whose own bind failed).
            other = await ownership.foreign_listener(sup, handle)
            if other is None:
                break
            impostor = other
        # Probing often keeps the lag between "ready" and noticing it short; after the
        # first 10 s (a real model load takes minutes) a tenth of the rate is enough.
        interval = t.readiness_poll_s if sup.clock() - t0 < 10 else t.readiness_poll_s * 10
        await pause(sup, op, min(interval, sup.poll_s * 5))
    info: dict[str, Any] = {}
    try:
        info = await sup.health.server_info(sup.url, 5.0)
    except (httpx.HTTPError, OSError, ValueError) as exc:
        # Only a figure for /status is missing; a bug (TypeError...) is not hidden.
        log.warning("pid %s is ready, but /server_info did not answer: %s", handle.pid, exc)
    assert sup.server is not None
    sup.server.ready_at = wall_iso()
    tokens = info.get("max_total_num_tokens")
    sup.server.max_total_num_tokens = int(tokens) if isinstance(tokens, (int, float)) else None
    sup.watch.reset_liveness()
    sup.transition(
        S.READY, f"pid {handle.pid} answered /health_generate after {sup.clock() - t0:.1f}s"
    )
    await sup.journal.record_ready()


async def judge_hung(sup: Supervisor, op: Operation, handle: ServerHandle, detail: str) -> None:
    """A server that had been ready does not answer now (found at a daemon's start-up):
    hung or only busy? The liveness rules decide — ``liveness_failures`` failed probes in
    a row, ``liveness_interval_s`` apart — not a start's whole ``ready_timeout_s``.
    Returns once it answers; raises ``StartFailed`` (hung) or ``Cancelled``."""
    t = sup.settings.timeouts
    failures = 1  # the probe that found it not answering
    while failures < t.liveness_failures:
        await pause(sup, op, t.liveness_interval_s)
        if handle.poll():
            raise StartFailed(await exit_reason(handle, "while being adopted"))
        probe = await sup.health.generate_ok(sup.url, t.liveness_timeout_s)
        if probe.ok:
            return
        failures += 1
        detail = probe.detail
    raise StartFailed(
        f"hung: pid {handle.pid} had been ready but failed {failures} liveness probes in a "
        f"row at adoption (last: {detail})"
    )


async def exit_reason(handle: ServerHandle, when: str) -> str:
    """Why the launcher exited, with what its log says (OOM, rejected arguments)."""
    why = f"the server (pid {handle.pid}) {handle.describe_exit()} {when}"
    tail = await asyncio.to_thread(tail_lines, handle.log_path, 60)
    text = "\n".join(tail).lower()
    if "out of memory" in text or "outofmemoryerror" in text:
        why += (
            "; its log reports CUDA out of memory: lower mem_fraction_static "
            "(or max_running_requests / chunked_prefill_size)"
        )
    elif "error: unrecognized arguments" in text or "error: argument" in text:
        line = next((ln for ln in reversed(tail) if "error:" in ln), "")
        why += f"; it rejected its arguments: {line.strip()}"
    return why
