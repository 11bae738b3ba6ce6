"""The daemon's own start, refused at start-up by a process not ours on a managed GPU
(the state stays ``stopped``, ``state_reason`` and ``/status``'s ``start_refused`` say
why): looked at again with back-off, and started once the GPUs are clean, unless an
operator acted meanwhile."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sglang_supervisor.engine.checks import foreign_processes
from sglang_supervisor.engine.errors import Busy
from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ServerRecord
from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.host.gpu import FOREIGN_ADVICE, GpuQueryError
from sglang_supervisor.states import ServerState

log = logging.getLogger("supervisor")
S = ServerState

#: What ``retry_refused_start`` does, for the reason an operator reads.
RETRY_WHAT = "backoff_initial_s doubling to backoff_max_s, until the GPUs are clean"


async def retry_refused_start(
    parts: Parts, record: ServerRecord, stop: StopRequest, start: Callable[[], Awaitable[object]]
) -> None:
    """The daemon's own start was refused (a process not ours on a managed GPU): look
    again after ``backoff_initial_s``, doubling to ``backoff_max_s``, and ``start()``
    (an operator's POST /start) once no such process is left. Ends without starting when
    an operator acted meanwhile (an operation, a stop) or the daemon stops; a look that
    finds the process still there says so in the state's reason, with when it looks next.
    """
    t = parts.settings.timeouts
    delay = t.backoff_initial_s
    attempt = 0
    while record.refused_start is not None:
        await asyncio.sleep(delay)
        operator_acted = record.state != S.STOPPED or parts.journal.recorded.stopped_by
        if stop.requested or operator_acted or record.refused_start is None:
            return
        attempt += 1
        try:
            foreign = await foreign_processes(parts, record)
        except GpuQueryError as exc:
            foreign = f"the managed GPUs cannot be queried: {exc}"
        delay = min(t.backoff_max_s, delay * 2)
        if foreign is not None:
            record.start_refused(
                f"not starting: {foreign}; {FOREIGN_ADVICE} (look {attempt}; the next in "
                f"{delay:g}s: {RETRY_WHAT})"
            )
            continue
        record.start_refused(None)
        log.info("the managed GPUs are clean now (look %d): starting", attempt)
        try:
            await start()
        except Busy:
            return  # an operator's operation runs: theirs to decide
        return
