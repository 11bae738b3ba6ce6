"""Review r1 of the engine split and the #23 merges: each test failed before its fix.

- A SIGHUP that changes ``[timeouts] diagnosis_hold_s`` takes effect (the reload logs it
  as changed; the diagnoser read it once, at construction).
- A telemetry read that outlives its server (a stop, an apply) does not write that
  server's figures into the record afterwards.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sglang_supervisor.observe.telemetry import Throughput
from sglang_supervisor.planner.diagnosis import LoadKind
from tests.unit.engine.common import settle
from tests.unit.fakes import make_rig, run

KV_BOUND = Throughput(running_requests=80, queued_requests=240, token_usage=0.998)


def test_a_reloaded_diagnosis_hold_takes_effect(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, diagnosis_hold_s=180.0)

    async def main() -> None:
        diagnoser = rig.sup.parts.diagnoser
        diagnoser.observe(KV_BOUND)
        view = rig.sup.view()
        assert view.diagnosis is not None and view.diagnosis.kind is LoadKind.NO_METRICS
        # What api/reload.py does on a SIGHUP: the running settings take the new timeouts.
        settings = rig.sup.settings
        settings.timeouts = settings.timeouts.model_copy(update={"diagnosis_hold_s": 0.0})
        diagnoser.observe(KV_BOUND)
        view = rig.sup.view()
        assert view.diagnosis is not None
        assert view.diagnosis.kind is LoadKind.KV_BOUND, view.diagnosis
        assert view.diagnosis.evidence["hold_s"] == 0.0

    run(main)


DECODE_LINE = (
    "[2026-12-01 10:00:00] Decode batch, #running-req: 77, #token: 9000, token usage: 0.99, "
    "gen throughput (token/s): 1234.0, #queue-req: 55\n"
)


def test_a_telemetry_read_that_outlives_its_server_writes_nothing(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        server = rig.sup.server
        assert server is not None
        # /metrics does not answer; the log's last decode line is the fallback.
        with open(server.handle.log_path, "a", encoding="utf-8") as f:
            f.write(DECODE_LINE)
        asked, answer = asyncio.Event(), asyncio.Event()

        async def slow_metrics(url: str, timeout_s: float) -> str | None:
            asked.set()
            await answer.wait()
            return None

        rig.health.metrics_text = slow_metrics  # type: ignore[method-assign]
        read = asyncio.create_task(rig.sup.watch._read_telemetry())
        await asyncio.wait_for(asked.wait(), 5)
        await settle(rig, rig.sup.submit_stop())  # the server is gone meanwhile
        assert rig.sup.server is None
        answer.set()
        await read
        # Stopped: no load to show, not the figures of the server that was stopped.
        assert rig.sup.throughput.running_requests is None, rig.sup.throughput
        assert rig.sup.view().status_json([])["throughput"]["source"] is None
        await rig.sup.shutdown()

    run(main)
