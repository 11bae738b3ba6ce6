"""``GET /history``: the server's load over the last hour, kept by the daemon
(``supervisor/observe/history.py``), so the status page draws its charts when it opens."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from sglang_supervisor.engine.watch import TELEMETRY_INTERVAL_S
from sglang_supervisor.observe.history import MAX_SAMPLES, history_json
from sglang_supervisor_api.responses import HistoryAnswer
from sglang_supervisor_api.routes import SupervisorDep

router = APIRouter()


@router.get("/history", response_model=HistoryAnswer)
async def history(sup: SupervisorDep) -> dict[str, Any]:
    """Load samples, oldest first, column by column (one per telemetry read, at most an
    hour's): running, queued, time to first token, cache hit rate, throughput, KV usage."""
    return history_json(sup.view().history, TELEMETRY_INTERVAL_S, MAX_SAMPLES)
