"""The shutdown request apart from the state (``engine/stop_request.py``): what the
daemon's stop waits for follows it — the rest of a drain while the shutdown is graceful,
none of it once it is forced."""

from __future__ import annotations

from pathlib import Path

from sglang_supervisor.states import ServerState
from tests.unit.fakes import make_rig, run, until

DRAIN_S = 60.0


def test_a_forced_shutdown_no_longer_waits_for_the_drain(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        assert rig.health.metrics is not None
        rig.health.metrics = rig.health.metrics.replace(
            'sglang:num_running_reqs{model_name="fake"} 0.0',
            'sglang:num_running_reqs{model_name="fake"} 3.0',
        )
        without_drain = rig.sup.teardown_budget_s()
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {}, drain_timeout_s=DRAIN_S)
        await until(lambda: rig.sup.state == ServerState.DRAINING, 3.0, "the drain")
        assert rig.sup.teardown_budget_s() > without_drain + DRAIN_S - 5
        rig.sup.request_shutdown()  # graceful: the drain runs to its end, so it is waited for
        assert rig.sup.shutdown_requested and not rig.sup.shutdown_forced
        assert rig.sup.teardown_budget_s() > without_drain + DRAIN_S - 5
        rig.sup.request_shutdown()  # a second request forces: no drain any more
        assert rig.sup.shutdown_forced
        assert rig.sup.teardown_budget_s() <= without_drain + 1
        assert await rig.sup.shutdown()
        assert op.finished and "forced: drain skipped" in (op.error or "")

    run(main)
