"""Review r1 of the engine split and the #23 merges: each test failed before its fix.

- A SIGHUP that changes ``[timeouts] diagnosis_hold_s`` takes effect (the reload logs it
  as changed; the diagnoser read it once, at construction).
"""

from __future__ import annotations

from pathlib import Path

from sglang_supervisor.observe.telemetry import Throughput
from sglang_supervisor.planner.diagnosis import LoadKind
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
