"""An apply's new server on probation: up *and healthy* for ``probation_s`` after it was
first ready, before it is committed (and added to the router). While it runs,
``record.probation`` says so: /status ``probation``, /readyz 503.
"""

from __future__ import annotations

import asyncio
import time

from sglang_supervisor.engine.boundaries import StartFailed, exit_reason, pause
from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ServerRecord
from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.host.backend import ServerHandle
from sglang_supervisor.operations import Operation, wall_iso


async def watch_probation(
    parts: Parts, record: ServerRecord, stop: StopRequest, op: Operation, handle: ServerHandle
) -> None:
    """The new server must stay up *and healthy* for ``probation_s`` after it was first
    ready: its launcher alive at every poll, and /health_generate answering a probe every
    fifth of the window (after the first, only while ``min(liveness_timeout_s, max(a
    fifth, 1 s))`` of it is left: time for a loaded server to answer). Each probe is
    bounded by the time left in the window (at most ``liveness_timeout_s``), so a hung
    server cannot stretch the window: one that ends with its last probe failed or still
    pending fails probation (``StartFailed``), as do
    ``liveness_failures`` failed probes in a row. While it runs, ``record.probation`` says
    so (/status ``probation``; /readyz answers 503)."""
    t = parts.settings.timeouts
    started = parts.clock()
    deadline = started + t.probation_s
    every = max(t.probation_s / 5, parts.poll_s)
    next_probe = started + min(every, t.probation_s / 2)  # at least one probe
    #: A later probe starts only with this much of the window left to answer in.
    min_answer = min(t.liveness_timeout_s, max(every, 1.0))
    failures = probes_ok = 0
    last: str | None = None  # the last probe's failure (None: it answered 200)
    until = wall_iso(time.time() + t.probation_s)
    record.probation_began(until, handle.pid)
    try:
        while True:
            if handle.poll():
                raise StartFailed(await exit_reason(handle, "within the probation window"))
            now = parts.clock()
            left = deadline - now
            if left <= 0:
                if last is None:
                    return
                raise StartFailed(
                    f"unhealthy at the end of the probation window ({t.probation_s:g}s, "
                    f"probation_s): the last /health_generate probe of pid {handle.pid} "
                    f"failed ({last}); {probes_ok} answered 200 before it"
                )
            if now >= next_probe:
                # The liveness timeout (a loaded server may take long to answer, and is
                # not hung), but never past the window's end: an answer after it is late.
                bound = min(t.liveness_timeout_s, left)
                try:
                    probe = await asyncio.wait_for(
                        parts.health.generate_ok(parts.url, bound), bound + 0.25
                    )
                    ok, detail = probe.ok, probe.detail
                except TimeoutError:
                    ok, detail = False, f"no answer within {bound:.1f}s, the window's rest"
                if ok:
                    failures, last = 0, None
                    probes_ok += 1
                    record.probation_probe_ok(probes_ok)
                else:
                    failures, last = failures + 1, detail
                    if failures >= t.liveness_failures:
                        raise StartFailed(
                            f"unhealthy within the probation window: {failures} "
                            f"/health_generate probes of pid {handle.pid} failed in a row "
                            f"(last: {detail})"
                        )
                next_probe = parts.clock() + every
                if deadline - next_probe < min_answer:
                    # Too little of the window left for a loaded server to answer: the
                    # window's end judges the probe that just ran.
                    next_probe = deadline + every
                continue
            await pause(stop, op, max(0.0, min(parts.poll_s, next_probe - now, left)))
    finally:
        record.probation_ended()
