"""A restarted daemon: last-good levers, leftovers, adoption.

Each test runs one scenario on a fresh event loop against a fake host (``tests.unit.fakes``):
GPUs whose memory is held by the ranks of fake launches, a process table the Supervisor
tears down, and health probes that follow the serving launch. Assertions are about what
an operator would notice: which levers serve, whether the GPUs are free, what the
operation and the error say.
"""

from __future__ import annotations

from pathlib import Path

from supervisor.levers import LeverSet
from supervisor.operations import SUCCEEDED
from supervisor.store import PersistedState, Store
from tests.unit.engine.common import (
    HELD_PER_RANK,
    S,
    apply,
    idle,
    launched,
    nothing_held,
)
from tests.unit.fakes import (
    INITIAL_LEVERS,
    Behaviour,
    FakeProbe,
    FakeProcessOps,
    Rig,
    make_rig,
    make_settings,
    run,
    until,
)

# ---------------------------------------------------------- daemon restarts


def test_a_restarted_daemon_starts_the_last_good_levers(tmp_path: Path) -> None:
    first = make_rig(tmp_path)

    async def before() -> None:
        await first.start_ready()
        op = await apply(first, {"mem_fraction_static": 0.9}, env={"NCCL_DEBUG": "INFO"})
        assert op.state == SUCCEEDED
        await first.sup.shutdown()

    run(before)
    second = make_rig(tmp_path, settings=make_settings(tmp_path))

    async def after() -> None:
        await second.start_ready()
        (spawn,) = second.procs.spawns
        assert spawn.argv[spawn.argv.index("--mem-fraction-static") + 1] == "0.9"
        assert spawn.env["NCCL_DEBUG"] == "INFO"
        status = await second.sup.status()
        assert status["levers"]["mem_fraction_static"] == 0.9
        assert status["last_good_levers"]["levers"]["mem_fraction_static"] == 0.9
        await second.sup.shutdown()

    run(after)


def killed_mid_apply(tmp_path: Path) -> tuple[FakeProcessOps, Rig]:
    """A daemon that applied mem_fraction_static 0.9 and died (no shutdown) while the new
    server was still loading; returns the shared fake host and that daemon's rig."""
    procs = FakeProcessOps(FakeProbe())
    first = make_rig(tmp_path, procs=procs)

    async def before() -> None:
        await first.start_ready()
        procs.plan(Behaviour(hold_ready=True))
        await first.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        await until(lambda: launched(first, 2), what="the new launch to be recorded")
        # The loop ends here without shutdown(): the daemon was SIGKILLed.

    run(before)
    return procs, first


def test_a_daemon_killed_mid_apply_restarts_with_last_good_after_clearing_leftovers(
    tmp_path: Path,
) -> None:
    """The old daemon died while its new levers were loading: their launch is a leftover."""
    procs, first = killed_mid_apply(tmp_path)
    leftover = procs.handles[1]
    assert procs.alive_pids() == {leftover.pid, *leftover.rank_pids}
    second = make_rig(tmp_path, procs=procs, settings=first.settings)

    async def after() -> None:
        await second.start_ready()
        assert second.transitions() == [
            ("stopped", "stopping"),
            ("stopping", "releasing"),
            ("releasing", "stopped"),
            ("stopped", "starting"),
            ("starting", "ready"),
        ]
        assert not (procs.alive_pids() & {leftover.pid, *leftover.rank_pids})
        relaunch = procs.spawns[2]
        assert relaunch.gpu_held_at_spawn == {0: 0, 1: 0}
        assert relaunch.argv == procs.spawns[0].argv  # last-good 0.8, not the pending 0.9
        assert (await second.sup.status())["levers"] == INITIAL_LEVERS
        await second.sup.shutdown()
        assert nothing_held(second)

    run(after)


def test_a_restarted_daemon_adopts_its_healthy_server(tmp_path: Path) -> None:
    procs = FakeProcessOps(FakeProbe())
    first = make_rig(tmp_path, procs=procs)

    async def before() -> None:
        await first.start_ready()  # then the daemon dies; the server keeps serving

    run(before)
    serving = procs.handles[0]
    second = make_rig(tmp_path, procs=procs, settings=first.settings)

    async def after() -> None:
        await second.start_ready()
        assert len(procs.spawns) == 1  # no model reload
        assert procs.teardowns == []
        status = await second.sup.status()
        assert status["server"]["pid"] == serving.pid
        assert status["levers"] == INITIAL_LEVERS
        assert second.probe.above_baseline() == {0: HELD_PER_RANK, 1: HELD_PER_RANK}
        # Adopted for real: a crash of the adopted server is noticed and recovered.
        procs.crash(serving)
        await until(lambda: second.sup.restarts == 1 and idle(second, S.READY))
        await second.sup.shutdown()
        assert nothing_held(second)

    run(after)


def test_a_restarted_daemon_does_not_adopt_a_dead_server(tmp_path: Path) -> None:
    procs = FakeProcessOps(FakeProbe())
    first = make_rig(tmp_path, procs=procs)

    async def before() -> None:
        await first.start_ready()

    run(before)
    procs.crash(procs.handles[0])  # the server died while no daemon was watching
    second = make_rig(tmp_path, procs=procs, settings=first.settings)

    async def after() -> None:
        await second.start_ready()
        assert len(procs.spawns) == 2
        assert (await second.sup.status())["server"]["pid"] == procs.handles[1].pid
        await second.sup.shutdown()

    run(after)


def test_a_restarted_daemon_adopts_an_interrupted_apply_that_became_ready(
    tmp_path: Path,
) -> None:
    procs, first = killed_mid_apply(tmp_path)
    procs.handles[1].held = False  # meanwhile the new server finished loading
    second = make_rig(tmp_path, procs=procs, settings=first.settings)

    async def after() -> None:
        await second.start_ready()
        assert len(procs.spawns) == 2
        status = await second.sup.status()
        assert status["server"]["pid"] == procs.handles[1].pid
        assert status["levers"]["mem_fraction_static"] == 0.9
        assert status["last_good_levers"]["levers"]["mem_fraction_static"] == 0.9
        persisted = Store(tmp_path).load()
        assert persisted.pending_operation is None
        await second.sup.shutdown()

    run(after)


def test_persisted_levers_that_no_longer_fit_sglang_fall_back_to_the_configured(
    tmp_path: Path,
) -> None:
    # An SGLang upgrade renamed a flag the last-good set uses: never a KeyError at launch.
    stale = LeverSet({"model_path": "m", "tp_size": 4, "flag_removed_in_upgrade": 1})
    Store(tmp_path).save(PersistedState(levers=stale, last_good=stale))
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        status = await rig.sup.status()
        assert "flag_removed_in_upgrade" not in status["levers"]
        assert status["levers"] == dict(rig.settings.server.levers)
        assert any("do not fit SGLang" in w for w in status["warnings"])
        await rig.sup.shutdown()

    run(main)
