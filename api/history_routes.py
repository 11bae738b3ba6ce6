"""``GET /history``: the server's load over the last hour, kept by the daemon
(``supervisor/observe/history.py``), so the status page draws its charts when it opens."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.exceptions import RequestValidationError

from sglang_supervisor.engine.watch import TELEMETRY_INTERVAL_S
from sglang_supervisor.observe.history import MAX_SAMPLES, history_json
from sglang_supervisor_api.responses import HistoryAnswer
from sglang_supervisor_api.routes import SupervisorDep

router = APIRouter()

#: How far ahead of the daemon's clock ``since`` may be (clock skew between hosts); a
#: ``since`` further ahead is a mistake (milliseconds for seconds, 1e308) that would
#: otherwise answer an empty history, silently, forever.
MAX_SINCE_AHEAD_S = 3600.0


@router.get("/history", response_model=HistoryAnswer)
async def history(
    sup: SupervisorDep,
    since: Annotated[
        float | None,
        Query(description="only samples taken after this unix time (seconds)", allow_inf_nan=False),
    ] = None,
) -> dict[str, Any]:
    """Load samples, oldest first, column by column (one per telemetry read, at most an
    hour's): running, queued, time to first token, cache hit rate, throughput, KV usage,
    inter-token latency, arrivals per second."""
    now = time.time()
    if since is not None and since > now + MAX_SINCE_AHEAD_S:
        raise RequestValidationError(
            [
                {
                    "loc": ("query", "since"),
                    "msg": f"since={since:g} is {since - now:.3g} s after the daemon's clock "
                    f"({now:.0f}): give a unix time in seconds (not milliseconds), at most "
                    f"{MAX_SINCE_AHEAD_S:.0f} s ahead; leave it out for the whole hour",
                    "type": "value_error",
                }
            ]
        )
    samples = sup.view().history
    if since is not None:
        samples = tuple(s for s in samples if s.t > since)
    return history_json(samples, TELEMETRY_INTERVAL_S, MAX_SAMPLES)
