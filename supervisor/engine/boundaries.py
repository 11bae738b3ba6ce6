"""Where an operation may end early: the phase boundary (``checkpoint``) and the waits
that end at a shutdown or an operator's cancel (``pause``), what they raise
(``Cancelled``), what a launch that never became ready raises (``StartFailed``) and why a
launcher exited (``exit_reason``). The launch (``engine.server``), its probation
(``engine.probation``) and the transactions all use them.
"""

from __future__ import annotations

import asyncio
import contextlib

from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.host.backend import ServerHandle
from sglang_supervisor.observe.telemetry import tail_lines
from sglang_supervisor.operations import Operation


class StartFailed(Exception):
    """A launch did not become ready; the message says why (exit status, OOM, timeout)."""


class Cancelled(Exception):
    """A shutdown or an operator's cancel, noticed at a phase boundary."""

    def __init__(self, reason: str, *, shutdown: bool) -> None:
        super().__init__(reason)
        self.shutdown = shutdown


SHUTDOWN_REASON = "the daemon was shut down during the operation"


def checkpoint(stop: StopRequest, op: Operation) -> None:
    """A phase boundary: raise ``Cancelled`` when a shutdown or a cancel is pending.

    An operator's cancel is honoured once (``op.cancelled`` records it), so the rollback
    that follows runs to its end; a shutdown is honoured at every boundary.
    """
    if stop.requested:
        raise Cancelled(SHUTDOWN_REASON, shutdown=True)
    reason = op.cancel_requested
    if reason is not None:
        op.cancel_requested = None
        op.cancelled = reason
        op.wake.clear()
        raise Cancelled(reason, shutdown=False)


async def pause(stop: StopRequest, op: Operation, seconds: float) -> None:
    """Sleep ``seconds``, ending early (``Cancelled``) on a shutdown or cancel request."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(op.wake.wait(), seconds)
    checkpoint(stop, op)


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
