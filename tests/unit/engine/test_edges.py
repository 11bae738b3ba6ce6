"""Every edge of the state machine is one the engine really takes, in the situation it
exists for; and the engine takes no other.

Rather than re-read ``states.ALLOWED``, this drives the Supervisor (on the fakes) through
one scenario per situation and collects the transitions it publishes on ``/events``. An
edge nothing takes is dead weight in the table (and a door for bugs); an edge the engine
takes outside the table would raise ``TransitionError`` in the scenario.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from sglang_supervisor.operations import FAILED, ROLLED_BACK, SUCCEEDED
from sglang_supervisor.states import ALLOWED, ServerState
from tests.unit.engine.common import S, apply, idle, launched, settle, state_of
from tests.unit.fakes import (
    DEFAULT_METRICS,
    Behaviour,
    FakeProbe,
    FakeProcessOps,
    Rig,
    make_rig,
    run,
    until,
)

Edge = tuple[str, str]
BUSY_METRICS = DEFAULT_METRICS.replace(
    'sglang:num_running_reqs{model_name="fake"} 0.0',
    'sglang:num_running_reqs{model_name="fake"} 3.0',
)


def taken(rig: Rig, scenario: Callable[[], Awaitable[None]]) -> set[Edge]:
    """Run ``scenario`` (it starts and shuts down ``rig``); the edges it took."""
    run(scenario)
    return set(rig.transitions())


def apply_with_drain_whose_new_server_dies(tmp_path: Path) -> set[Edge]:
    """stopped -> starting -> ready -> draining -> stopping -> releasing -> stopped ->
    starting -> stopping (the new levers died) ... -> ready (rolled back)."""
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(exit_on_start=1))
        op = await apply(rig, {"mem_fraction_static": 0.9}, drain_timeout_s=5)
        assert op.state == ROLLED_BACK
        await rig.sup.shutdown()

    return taken(rig, main)


def apply_cancelled_during_its_drain(tmp_path: Path) -> set[Edge]:
    """draining -> ready: nothing was stopped."""
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.health.metrics = BUSY_METRICS
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {}, drain_timeout_s=600)
        await until(lambda: state_of(rig) == S.DRAINING)
        rig.sup.request_cancel(op.id)
        await settle(rig, op)
        assert state_of(rig) == S.READY
        await rig.sup.shutdown()

    return taken(rig, main)


def crash_loop_then_an_operators_stop(tmp_path: Path) -> set[Edge]:
    """ready -> stopping -> releasing -> backoff -> starting ... backoff -> failed; then
    failed -> stopping (the operator's stop)."""
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(exit_on_start=1), Behaviour(exit_on_start=1))
        rig.procs.crash(rig.procs.handles[0])
        await until(lambda: idle(rig, S.FAILED))
        stop = await settle(rig, rig.sup.submit_stop())
        assert stop.state == SUCCEEDED and state_of(rig) == S.STOPPED
        await rig.sup.shutdown()

    return taken(rig, main)


def apply_during_a_backoff(tmp_path: Path) -> set[Edge]:
    """backoff -> stopping: the operator's apply preempts the waiting restart."""
    rig = make_rig(tmp_path, backoff_initial_s=600.0, backoff_max_s=600.0)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.crash(rig.procs.handles[0])
        await until(lambda: state_of(rig) == S.BACKOFF)
        assert (await apply(rig, {"mem_fraction_static": 0.7})).state == SUCCEEDED
        await rig.sup.shutdown()

    return taken(rig, main)


def restart_after_an_operators_stop(tmp_path: Path) -> set[Edge]:
    """loading -> stopped: start-up finds nothing of ours running, and the operator's
    stop holds across the daemon's restart."""
    first = make_rig(tmp_path)

    async def before() -> None:
        await first.start_ready()
        assert (await settle(first, first.sup.submit_stop())).state == SUCCEEDED
        await first.sup.shutdown()

    run(before)
    second = make_rig(tmp_path, settings=first.settings)

    async def after() -> None:
        await second.sup.start()
        await until(lambda: idle(second, S.STOPPED), 5.0, "start-up to settle stopped")
        assert second.procs.spawns == []
        await second.sup.shutdown()

    return taken(second, after)


def restart_after_a_daemon_died_mid_apply(tmp_path: Path) -> set[Edge]:
    """loading -> stopping: leftovers of the dead daemon are torn down first."""
    procs = FakeProcessOps(FakeProbe())
    first = make_rig(tmp_path, procs=procs)

    async def before() -> None:
        await first.start_ready()
        procs.plan(Behaviour(hold_ready=True))
        await first.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        await until(lambda: launched(first, 2))

    run(before)  # ends without shutdown(): the daemon died
    second = make_rig(tmp_path, procs=procs, settings=first.settings)

    async def after() -> None:
        await second.start_ready()
        await second.sup.shutdown()

    return taken(second, after)


def a_stop_that_cannot_release(tmp_path: Path) -> set[Edge]:
    """releasing -> failed: a rank stuck in the driver keeps its memory."""
    rig = make_rig(tmp_path)
    rig.procs.plan(Behaviour(unkillable=True))

    async def main() -> None:
        await rig.start_ready()
        stop = await settle(rig, rig.sup.submit_stop())
        assert stop.state == FAILED and state_of(rig) == S.FAILED
        rig.procs.release_stuck()
        await rig.sup.shutdown()

    return taken(rig, main)


SCENARIOS = [
    apply_with_drain_whose_new_server_dies,
    apply_cancelled_during_its_drain,
    crash_loop_then_an_operators_stop,
    apply_during_a_backoff,
    restart_after_an_operators_stop,
    restart_after_a_daemon_died_mid_apply,
    a_stop_that_cannot_release,
]


def test_every_allowed_edge_is_taken_by_the_engine_and_no_other(tmp_path: Path) -> None:
    edges: set[Edge] = set()
    for i, scenario in enumerate(SCENARIOS):
        state_dir = tmp_path / str(i)
        state_dir.mkdir()
        edges |= scenario(state_dir)
    allowed = {(str(old), str(new)) for old, targets in ALLOWED.items() for new in targets}
    assert edges <= allowed  # (a step outside would have raised TransitionError anyway)
    assert sorted(allowed - edges) == [], "edges in states.ALLOWED that nothing takes"
    assert {ServerState(old) for old, _ in edges} == set(ServerState)
