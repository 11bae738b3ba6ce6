"""Issue 19 §5 and §6 on fakes: what is known before the stop is checked before it (the
router, a no-op apply), and the server called ready is ours (the port before every
launch, readiness only from a listener of this launch, a probation a hung server cannot
stretch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor.operations import FAILED, ROLLED_BACK, SUCCEEDED
from sglang_supervisor.phases import OpKind, PhaseName
from sglang_supervisor.sglang.levers import LeverError
from tests.unit.engine.common import S, apply, idle, ops_of, phase_detail, settle
from tests.unit.engine.test_router_steps import FakeRouter
from tests.unit.fakes import Behaviour, make_rig, run, until

#: A pid no process has (above the kernel's default pid_max of 4194304).
SQUATTER = 4_999_999

# ------------------------------------------------------------- the port


def test_an_apply_whose_port_is_taken_after_the_stop_names_the_pid(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.port_squatters = [SQUATTER]
        op = await apply(rig, {"mem_fraction_static": 0.9})
        assert op.state == FAILED, op.error
        assert len(rig.procs.spawns) == 1  # neither the new nor the last-good one spawned
        start = phase_detail(op, PhaseName.START)
        assert f"is held by pid {SQUATTER}" in start and "server.port" in start
        assert f"pid {SQUATTER}" in (op.error or "")
        assert S.READY not in {new for _, new in rig.transitions()[2:]}

    run(main)


def test_a_start_with_the_port_taken_never_becomes_ready(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.procs.port_squatters = [SQUATTER]

    async def main() -> None:
        await rig.sup.start()
        await until(lambda: idle(rig, S.FAILED), 5.0, "the crash loop to end in failed")
        assert rig.procs.spawns == []
        assert ("starting", "ready") not in rig.transitions()
        assert f"pid {SQUATTER}" in rig.sup.state_reason
        await rig.sup.shutdown()

    run(main)


def test_readiness_answered_by_another_process_is_not_ours(tmp_path: Path) -> None:
    """The port was free at the check, then another process took it before the launch
    could bind: its /health_generate 200 never makes this launch ready."""
    rig = make_rig(tmp_path, ready_timeout_s=0.3, crash_loop_count=1)
    spawn = rig.procs.spawn

    def spawn_then_squat(*args: Any, **kw: Any) -> Any:
        handle = spawn(*args, **kw)
        rig.procs.port_squatters = [SQUATTER]
        return handle

    rig.procs.spawn = spawn_then_squat  # type: ignore[method-assign]
    rig.procs.plan(Behaviour(binds=False))

    async def main() -> None:
        await rig.sup.start()
        await until(lambda: idle(rig, S.FAILED), 5.0, "the start to fail")
        assert ("starting", "ready") not in rig.transitions()
        (op,) = ops_of(rig, OpKind.START)
        start = phase_detail(op, PhaseName.START)
        assert "answered 200, but not from this launch" in start
        assert f"pid {SQUATTER}" in start
        await rig.sup.shutdown()

    run(main)


@pytest.mark.parametrize("who", ["launcher", "rank"])
def test_a_launch_that_exits_right_after_answering_is_never_called_foreign(
    tmp_path: Path, who: str
) -> None:
    """Issue 27 §4: the new server answered /health_generate and crashed while the daemon
    judged who had answered — after its socket scan, before its member scan. Its exit is
    reported as its own (within probation: it had answered), never as "another process"
    holding the port, and nobody else is named. With ``rank``, a member of the launch (not
    the launcher) held the socket and is the one that exited: the launch then fails as a
    start whose listener vanished, the launcher's exit the reason."""
    rig = make_rig(tmp_path, probation_s=0.5)
    listeners = rig.procs.port_listeners
    crashed: list[int] = []

    def scan_then_crash(host: str, port: int) -> list[int | None]:
        found = listeners(host, port)
        if len(rig.procs.handles) != 2 or crashed:
            return found
        new = rig.procs.handles[1]
        if new.ready_at is not None:
            if who == "rank":
                found = [new.rank_pids[0]]  # the rank held the socket, not the launcher
            rig.procs.crash(new, returncode=1)
            crashed.append(new.pid)
        return found

    rig.procs.port_listeners = scan_then_crash  # type: ignore[method-assign]

    async def main() -> None:
        await rig.start_ready()
        op = await apply(rig, {"mem_fraction_static": 0.9})
        assert crashed, "the new launch answered and crashed during the verdict"
        assert op.state == ROLLED_BACK, op.error
        error = op.error or ""
        assert f"pid {crashed[0]}) exited with code 1" in error, error
        assert "another process" not in error and "not part of this launch" not in error
        if who == "launcher":
            assert "within the probation window" in error, error
        assert idle(rig, S.READY)
        assert rig.sup.levers.levers["mem_fraction_static"] == 0.8
        await rig.sup.shutdown()

    run(main)


# --------------------------------------------------------------- probation


def test_a_hung_new_server_fails_probation_when_its_window_ends(tmp_path: Path) -> None:
    """Frozen right after ready, probes with a 30 s timeout: the 1 s window still ends
    at 1 s (each probe is bounded by the time left), and the apply rolls back."""
    rig = make_rig(tmp_path, probation_s=1.0, liveness_timeout_s=30.0, liveness_failures=3)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(freeze_after_ready=True))
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        await until(lambda: rig.sup.probation is not None, 3.0, "probation to begin")
        view = rig.sup.view()
        assert view.state == S.READY and view.probation is not None
        assert view.probation["pid"] == rig.procs.handles[1].pid
        await settle(rig, op, timeout=10.0)  # unbounded probes took 3 x 30 s
        assert op.state == ROLLED_BACK, op.error
        probation = next(p for p in op.phases if p.name == PhaseName.PROBATION)
        assert probation.state == FAILED
        assert "end of the probation window" in probation.detail
        assert rig.sup.probation is None and idle(rig, S.READY)
        assert rig.sup.server is not None
        assert rig.sup.server.levers.levers["mem_fraction_static"] == 0.8

    run(main)


# ------------------------------------------------------------ no-op apply


def test_an_apply_of_the_serving_levers_restarts_nothing(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        pid = rig.procs.handles[0].pid
        dry = await rig.sup.submit_apply({"mem_fraction_static": 0.8}, {}, dry_run=True)
        assert dry.phases[-1].detail.endswith(
            "would change nothing (the server would not be restarted)"
        )
        op = await apply(rig, {"mem_fraction_static": 0.8})
        assert op.state == SUCCEEDED, op.error
        assert [p.name for p in op.phases] == ["validate", "preflight", "commit"]
        assert f"nothing changed: pid {pid} already serves" in op.phases[-1].detail
        assert len(rig.procs.spawns) == 1 and rig.procs.teardowns == []
        assert rig.sup.server is not None and rig.sup.server.handle.pid == pid

        forced = await settle(
            rig, await rig.sup.submit_apply({"mem_fraction_static": 0.8}, {}, force_restart=True)
        )
        assert forced.state == SUCCEEDED, forced.error
        assert len(rig.procs.spawns) == 2
        assert rig.sup.server is not None and rig.sup.server.handle.pid != pid

    run(main)


# ----------------------------------------------------------------- router


@pytest.mark.parametrize("fault", ["down", "garbage"])
def test_a_router_that_cannot_take_the_new_server_refuses_the_apply_up_front(
    tmp_path: Path, fault: str
) -> None:
    router = FakeRouter()
    rig = make_rig(tmp_path, router=router)

    async def main() -> None:
        await rig.start_ready()
        setattr(router, fault, True)
        pid = rig.procs.handles[0].pid
        with pytest.raises(LeverError) as caught:
            await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        (problem,) = caught.value.problems
        assert problem.lever == "router"
        assert "http://router/workers" in problem.message
        assert "without_router" in problem.message
        assert rig.procs.teardowns == [] and len(rig.procs.spawns) == 1
        assert rig.sup.server is not None and rig.sup.server.handle.pid == pid

        op = await settle(
            rig, await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {}, without_router=True)
        )
        assert op.state == SUCCEEDED, op.error  # not rolled back for the router
        assert rig.sup.levers.levers["mem_fraction_static"] == 0.9
        assert "outside the router (without_router)" in op.phases[-1].detail
        await rig.sup.shutdown()

    run(main)
