"""An apply is one operation from the request on (issue 21 §2): its validate and
preflight phases carry the times they really ran, and count in the apply's duration and
its metrics; a refused apply still leaves nothing behind."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor.engine import checks
from sglang_supervisor.observe.metrics import SupervisorMetrics
from sglang_supervisor.operations import SUCCEEDED, Operation, Phase
from sglang_supervisor.phases import OpKind, PhaseName
from sglang_supervisor.sglang.levers import LeverError, LeverSet
from tests.unit.engine.common import settle
from tests.unit.fakes import make_rig, run

#: How long the slowed-down validation takes (SGLang's first resolution takes seconds).
SLOW_S = 0.3


def slow_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    real = checks.validate_with_sglang

    async def slow(parts: Any, record: Any, requested: LeverSet) -> Any:
        await asyncio.sleep(SLOW_S)  # stands for SGLang answering slowly
        return await real(parts, record, requested)

    monkeypatch.setattr(checks, "validate_with_sglang", slow)


def phase(op: Operation, name: PhaseName) -> Phase:
    return next(p for p in op.phases if p.name == name)


def test_a_slow_validation_is_timed_and_counts_in_the_apply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = make_rig(tmp_path)
    metrics = SupervisorMetrics(rig.sup)

    async def main() -> None:
        await rig.start_ready()
        slow_validation(monkeypatch)
        op = await settle(rig, await rig.sup.submit_apply({"mem_fraction_static": 0.7}, {}))
        assert op.state == SUCCEEDED, op.error
        validate, preflight = phase(op, PhaseName.VALIDATE), phase(op, PhaseName.PREFLIGHT)
        assert validate.ended_at is not None and preflight.ended_at is not None
        assert op.created_at <= validate.started_at < validate.ended_at, validate.to_json()
        assert validate.ended_at <= preflight.started_at <= preflight.ended_at
        assert validate.duration_s is not None and validate.duration_s >= SLOW_S
        assert op.duration_s is not None and op.duration_s >= SLOW_S + sum(
            p.duration_s or 0 for p in op.phases if p.name != PhaseName.VALIDATE
        )
        observed = metrics.operation_seconds.labels(OpKind.APPLY)._sum.get()  # type: ignore[attr-defined]
        assert observed >= SLOW_S
        await rig.sup.shutdown()

    run(main)


def test_a_refused_apply_leaves_no_operation_and_is_not_busy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        kept = set(rig.sup.operations)
        slow_validation(monkeypatch)
        with pytest.raises(LeverError) as info:
            await rig.sup.submit_apply({"mem_fraction_static": 7}, {})
        assert "mem_fraction_static" in str(info.value)
        assert rig.sup.operation is None and set(rig.sup.operations) == kept
        # A dry run while an apply validates is answered beside it.
        applying = asyncio.ensure_future(rig.sup.submit_apply({"mem_fraction_static": 0.7}, {}))
        dry = await rig.sup.submit_apply({"mem_fraction_static": 0.6}, {}, dry_run=True)
        assert dry.dry_run and dry.state == SUCCEEDED
        op = await settle(rig, await applying)
        assert op.state == SUCCEEDED, op.error
        assert (await rig.sup.status())["levers"]["mem_fraction_static"] == 0.7
        await rig.sup.shutdown()

    run(main)
