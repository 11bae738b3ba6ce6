"""``GET /history``: the server's load over the last hour, kept by the daemon
(``supervisor/observe/history.py``), so the status page draws its charts when it opens."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from sglang_supervisor.engine.watch import TELEMETRY_INTERVAL_S
from sglang_supervisor.observe.history import MAX_SAMPLES, history_json
from sglang_supervisor_api.responses import HistoryAnswer
from sglang_supervisor_api.routes import SupervisorDep

router = APIRouter()


@router.get("/history", response_model=HistoryAnswer)
async def history(
    sup: SupervisorDep,
    since: Annotated[
        float | None, Query(description="only samples taken after this unix time")
    ] = None,
) -> dict[str, Any]:
    """Load samples, oldest first, column by column (one per telemetry read, at most an
    hour's): running, queued, time to first token, cache hit rate, throughput, KV usage."""
    samples = sup.view().history
    if since is not None:
        samples = tuple(s for s in samples if s.t > since)
    return history_json(samples, TELEMETRY_INTERVAL_S, MAX_SAMPLES)
