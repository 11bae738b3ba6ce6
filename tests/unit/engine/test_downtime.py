"""An apply states the time without service it expects before anything stops
(``expected_downtime``: the planner's rule on this daemon's figures), and the operation
records the time it was without service (``downtime``: from the stop to the ready of the
new server, or of the rollback's) (issue 29 §3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_supervisor.operations import ROLLED_BACK, SUCCEEDED, Operation
from sglang_supervisor.phases import PhaseName
from sglang_supervisor.planner.stopcost import MEASURED_PIN_S_PER_GIB
from sglang_supervisor.units import GiB
from tests.unit.engine.common import apply, settle
from tests.unit.fakes import Behaviour, make_rig, run


def parts_of(op: Operation) -> dict[str, dict[str, object]]:
    assert op.expected_downtime is not None
    return {p["name"]: p for p in op.expected_downtime["parts"]}


def span(op: Operation, first: str, last: str) -> float:
    """From the start of phase ``first`` to the end of phase ``last``."""
    a = next(p for p in op.phases if p.name == first)
    b = next(p for p in op.phases if p.name == last)
    return b._t0 + (b.duration_s or 0) - a._t0


def test_an_apply_states_its_cost_and_records_its_time_without_service(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        server = rig.sup.view().server
        assert server is not None and server.start_s is not None
        dry = await settle(
            rig, await rig.sup.submit_apply({"mem_fraction_static": 0.7}, {}, dry_run=True)
        )
        assert dry.expected_downtime is not None and dry.to_json()["downtime"] is None
        op = await apply(rig, {"mem_fraction_static": 0.7})
        assert op.state == SUCCEEDED, op.error
        parts = parts_of(op)
        # The serving server's measured start, the same weights per GPU.
        assert parts["load"]["seconds"] == pytest.approx(server.start_s, abs=0.01)
        assert parts["unpin"]["seconds"] == 0 and parts["pin"]["seconds"] == 0
        assert op.expected_downtime is not None and op.expected_downtime["complete"] is True
        down = op.to_json()["downtime"]
        assert down["serving_again"] is True
        assert down["intervals"] == [
            {
                "from": "stop",
                "to": "start",
                "seconds": pytest.approx(span(op, "stop", "start"), abs=1e-3),
            }
        ]
        # The new server's own start is measured in turn: the next apply starts from it.
        again = rig.sup.view().server
        assert again is not None and again.start_s is not None and again.pid != server.pid
        await rig.sup.shutdown()

    run(main)


def test_a_host_cache_costs_its_pinning_at_the_measured_rate(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        levers = {"enable_hierarchical_cache": True, "hicache_size": 4}
        op = await settle(rig, await rig.sup.submit_apply(levers, {}, dry_run=True))
        assert op.state == SUCCEEDED, op.error
        pinned = 2 * 4e9 / GiB  # two ranks × 4 GB
        assert parts_of(op)["pin"]["seconds"] == pytest.approx(
            MEASURED_PIN_S_PER_GIB * pinned, abs=0.01
        )
        assert "h200_teardown.md" in str(parts_of(op)["pin"]["basis"])
        # An apply that changes nothing restarts nothing and expects no downtime.
        same = await apply(rig, {"mem_fraction_static": 0.8})
        assert same.expected_downtime is None and same.to_json()["downtime"] is None
        await rig.sup.shutdown()

    run(main)


def test_a_rollback_is_without_service_until_the_last_good_levers_are_ready(
    tmp_path: Path,
) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(exit_on_start=1))
        op = await apply(rig, {"mem_fraction_static": 0.7})
        assert op.state == ROLLED_BACK
        down = op.to_json()["downtime"]
        assert down["serving_again"] is True
        (interval,) = down["intervals"]
        # The new server never became ready: one stretch, from the stop to the rollback's ready.
        assert interval["from"] == PhaseName.STOP and interval["to"] == "rollback_start"
        assert interval["seconds"] == pytest.approx(span(op, "stop", "rollback_start"), abs=1e-3)
        await rig.sup.shutdown()

    run(main)
