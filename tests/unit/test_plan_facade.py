"""``POST /plan`` reads the engine through one facade method (issue 21 §2):
``Supervisor.plan_inputs()``, a frozen snapshot taken on the event loop, so the planner's
worker threads never read the ``Supervisor``."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from sglang_supervisor.engine import PlanInputs
from tests.unit.fakes import make_rig, run

PLAN = Path(__file__).resolve().parents[2] / "api" / "plan.py"
FACADE_TYPES = {"PlanInputs", "SupervisorView"}


def test_api_plan_imports_only_the_facade_types_of_the_engine() -> None:
    bad = []
    for node in ast.walk(ast.parse(PLAN.read_text(), str(PLAN))):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.startswith("sglang_supervisor.engine")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "sglang_supervisor.engine"
        ):
            names = {a.name for a in node.names}
            if node.module != "sglang_supervisor.engine" or not names <= FACADE_TYPES:
                bad.append(f"from {node.module} import {', '.join(sorted(names))}")
    assert not bad, f"api/plan.py reaches into the engine: {bad}"


def test_api_plan_reads_only_plan_inputs_of_the_supervisor() -> None:
    read = set(re.findall(r"\bsup\.(\w+)", PLAN.read_text()))
    assert read == {"plan_inputs"}, f"api/plan.py reads sup.{sorted(read)}"


def test_plan_inputs_is_a_frozen_snapshot_of_the_daemon(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        inputs = rig.sup.plan_inputs()
        assert isinstance(inputs, PlanInputs)
        with pytest.raises(dataclasses.FrozenInstanceError):
            inputs.ask_sglang = None  # type: ignore[misc]
        assert inputs.view.levers == rig.sup.levers
        assert inputs.backend is rig.sup.backend
        t = rig.settings.timeouts
        assert (inputs.stop.stop_grace_s, inputs.stop.kill_timeout_s) == (
            t.stop_grace_s,
            t.kill_timeout_s,
        )
        # No live SGLang in the fake rig: the planner's formulas answer, not SGLang.
        assert not rig.sup.schema_live and inputs.ask_sglang is None
        await rig.sup.shutdown()

    run(main)
