"""A restarted daemon: last-good levers, leftovers, adoption.

Each test runs one scenario on a fresh event loop against a fake host (``tests.unit.fakes``):
GPUs whose memory is held by the ranks of fake launches, a process table the Supervisor
tears down, and health probes that follow the serving launch. Assertions are about what
an operator would notice: which levers serve, whether the GPUs are free, what the
operation and the error say.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from sglang_supervisor.config import Settings
from sglang_supervisor.observe.health import Probe
from sglang_supervisor.operations import FAILED, ROLLED_BACK, SUCCEEDED
from sglang_supervisor.phases import PhaseName
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.store import PersistedState, Store
from tests.unit.engine.common import (
    HELD_PER_RANK,
    S,
    apply,
    idle,
    launched,
    nothing_held,
    phase_detail,
    settle,
)
from tests.unit.fakes import (
    INITIAL_LEVERS,
    Behaviour,
    FakeHealth,
    FakeProbe,
    FakeProcessOps,
    Rig,
    make_rig,
    make_settings,
    run,
    until,
)

# ---------------------------------------------------------- daemon restarts


def make_settings_like(rig: Rig, **timeouts: Any) -> Settings:
    """The same daemon (state dir, instance, port), with other timeouts."""
    t = rig.settings.timeouts.model_copy(update=timeouts)
    return rig.settings.model_copy(update={"timeouts": t})


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
            ("loading", "stopping"),
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


# ------------------------------------- a restart finishes what was started, honestly


def test_a_daemon_killed_in_probation_finishes_it_on_adopt_and_rolls_back(
    tmp_path: Path,
) -> None:
    """The daemon died while the new levers were in probation. The restarted daemon
    adopts the new server, watches the rest of its probation, sees it crash, and rolls
    back: the untested levers never become last-good."""
    procs = FakeProcessOps(FakeProbe())
    first = make_rig(tmp_path, procs=procs, probation_s=30.0)

    async def before() -> None:
        await first.start_ready()
        await first.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        await until(lambda: len(procs.spawns) == 2 and first.sup.state == S.READY)
        # The loop ends here, in probation, without shutdown(): the daemon was SIGKILLed.

    run(before)
    new = procs.handles[1]
    new.ready_at = None
    new.behaviour.crash_after_ready_s = 0.2  # after the next daemon's first probe
    second = make_rig(tmp_path, procs=procs, settings=make_settings_like(first, probation_s=1.0))

    async def after() -> None:
        await second.sup.start()
        op = second.sup.operation
        assert op is not None
        await settle(second, op)
        assert op.state == ROLLED_BACK, op.error
        assert "failed probation" in (op.rollback_reason or "")
        status = await second.sup.status()
        assert status["last_good_levers"]["levers"] == INITIAL_LEVERS
        assert status["levers"] == INITIAL_LEVERS
        serving = procs.current()
        assert serving is procs.handles[2]
        argv = procs.spawns[2].argv
        assert argv[argv.index("--mem-fraction-static") + 1] == "0.8"
        assert Store(tmp_path).load().pending_operation is None
        await second.sup.shutdown()

    run(after)


def test_a_failed_apply_is_not_reported_as_interrupted_after_a_restart(tmp_path: Path) -> None:
    first = make_rig(tmp_path)

    async def before() -> None:
        await first.start_ready()
        first.procs.plan(Behaviour(exit_on_start=1), Behaviour(exit_on_start=3))
        op = await apply(first, {"mem_fraction_static": 0.9})
        assert op.state == FAILED
        await first.sup.shutdown()

    run(before)
    assert Store(tmp_path).load().pending_operation is None
    second = make_rig(tmp_path, settings=first.settings)

    async def after() -> None:
        await second.start_ready()
        start = second.sup.ops.last
        assert start is not None
        assert PhaseName.INTERRUPTED_APPLY not in [p.name for p in start.phases]
        await second.sup.shutdown()

    run(after)


def test_an_operators_stop_survives_a_daemon_restart(tmp_path: Path) -> None:
    first = make_rig(tmp_path)

    async def before() -> None:
        await first.start_ready()
        stop = await settle(first, first.sup.submit_stop())
        assert stop.state == SUCCEEDED
        await first.sup.shutdown()

    run(before)
    second = make_rig(tmp_path, settings=first.settings)

    async def after() -> None:
        await second.sup.start()
        op = second.sup.operation
        assert op is not None
        await settle(second, op)
        assert op.state == SUCCEEDED
        assert second.procs.spawns == []
        status = await second.sup.status()
        assert status["state"] == "stopped" and status["server"] is None
        assert "an operator stopped the server" in str([p.detail for p in op.phases])
        start = await settle(second, await second.sup.submit_start())
        assert start.state == SUCCEEDED
        assert len(second.procs.spawns) == 1
        await second.sup.shutdown()

    run(after)
    third = make_rig(tmp_path, settings=first.settings)

    async def later() -> None:
        await third.start_ready()  # started again by the operator: a restart starts it
        assert len(third.procs.spawns) == 1
        await third.sup.shutdown()

    run(later)


def test_a_hung_server_found_at_restart_is_judged_by_the_liveness_rules(
    tmp_path: Path,
) -> None:
    """It had been ready; now /health_generate times out. Not a start: its ready timeout
    (10 minutes here) is not waited out; after liveness_failures probes it is replaced."""
    procs = FakeProcessOps(FakeProbe())
    first = make_rig(tmp_path, procs=procs)

    async def before() -> None:
        await first.start_ready()  # then the daemon dies

    run(before)
    hung = procs.handles[0]
    hung.hung = True
    second = make_rig(
        tmp_path, procs=procs, settings=make_settings_like(first, ready_timeout_s=600.0)
    )

    async def after() -> None:
        await second.sup.start()
        op = second.sup.operation
        assert op is not None
        await settle(second, op, timeout=5.0)
        assert op.state == SUCCEEDED, op.error
        assert "hung" in str([p.detail for p in op.phases])
        assert hung.returncode is not None
        assert (await second.sup.status())["server"]["pid"] == procs.handles[1].pid
        await second.sup.shutdown()

    run(after)


def test_an_operator_can_cancel_the_adoption_of_a_server_that_does_not_answer(
    tmp_path: Path,
) -> None:
    """Judging the adopted server takes liveness_failures × liveness_interval_s (here 10
    minutes): the operator cancels instead; it is torn down and stops and applies work."""
    procs = FakeProcessOps(FakeProbe())
    first = make_rig(tmp_path, procs=procs)

    async def before() -> None:
        await first.start_ready()

    run(before)
    hung = procs.handles[0]
    hung.hung = True
    second = make_rig(
        tmp_path, procs=procs, settings=make_settings_like(first, liveness_interval_s=300.0)
    )

    async def after() -> None:
        await second.sup.start()
        op = second.sup.operation
        assert op is not None
        await until(lambda: any(p.name == "adopt" for p in op.phases))
        second.sup.request_cancel(op.id)
        await settle(second, op, timeout=5.0)
        assert op.state == FAILED
        assert "cancelled by an operator" in (op.error or "")
        assert hung.returncode is not None
        assert second.sup.state == S.STOPPED
        assert nothing_held(second)
        start = await settle(second, await second.sup.submit_start())
        assert start.state == SUCCEEDED
        await second.sup.shutdown()

    run(after)


def test_an_interrupted_apply_says_which_levers_start_with_levers_source_config(
    tmp_path: Path,
) -> None:
    """With ``levers_source = "config"`` the restarted daemon starts the file's levers,
    and the interrupted apply's phase says so (it said "the last-good levers")."""
    procs, first = killed_mid_apply(tmp_path)
    levers = {**first.settings.server.levers, "mem_fraction_static": 0.7}
    server = first.settings.server.model_copy(update={"levers_source": "config", "levers": levers})
    second = make_rig(
        tmp_path, procs=procs, settings=first.settings.model_copy(update={"server": server})
    )

    async def after() -> None:
        await second.start_ready()
        argv = procs.spawns[-1].argv
        assert argv[argv.index("--mem-fraction-static") + 1] == "0.7"
        start = second.sup.ops.last
        assert start is not None
        detail = phase_detail(start, PhaseName.INTERRUPTED_APPLY)
        assert "was interrupted by the daemon's exit; starting the config file's levers" in detail
        await second.sup.shutdown()

    run(after)


def test_a_server_changed_in_place_when_the_daemon_died_is_not_adopted(tmp_path: Path) -> None:
    """The daemon died in the middle of a live change (or a weights update): which values
    the server holds is not known, so the next daemon starts the last-good levers anew."""
    procs = FakeProcessOps(FakeProbe())
    first = make_rig(tmp_path, procs=procs)

    async def before() -> None:
        await first.start_ready()
        changing = LeverSet({**INITIAL_LEVERS, "log_requests": True})
        await first.sup.parts.journal.begin_apply("0123456789ab", changing, path="live")
        # ...and the daemon dies here; its server keeps serving.

    run(before)
    changed = procs.handles[0]
    second = make_rig(tmp_path, procs=procs, settings=first.settings)

    async def after() -> None:
        await second.start_ready()
        assert len(procs.spawns) == 2 and changed.poll()  # torn down, relaunched
        status = await second.sup.status()
        assert status["server"]["pid"] != changed.pid
        assert status["levers"] == INITIAL_LEVERS
        op = next(iter(second.sup.operations.values()))
        detail = phase_detail(op, PhaseName.INTERRUPTED_APPLY)
        assert "apply 0123456789ab was interrupted" in detail
        await second.sup.shutdown()

    run(after)


def test_cancelling_the_start_up_before_it_launched_is_an_operators_stop(tmp_path: Path) -> None:
    """Issue 27 §7: the start-up operation is cancelled while it clears a dead daemon's
    leftovers, before it launched anything: a stop that holds, here and across the next
    restart (before, the operation failed and the next daemon launched anyway)."""
    procs, first = killed_mid_apply(tmp_path)
    gate = threading.Event()
    second = make_rig(tmp_path, procs=procs, settings=first.settings)

    async def after() -> None:
        procs.teardown_gate = gate
        await second.sup.start()
        op = second.sup.operation
        assert op is not None
        await until(lambda: procs.teardowns_running == 1, what="the leftovers' teardown")
        assert second.sup.request_cancel(op.id) is op
        procs.teardown_gate = None
        gate.set()
        await settle(second, op)
        assert op.state == FAILED, op.error
        assert "nothing was started and the server stays stopped" in (op.error or "")
        assert idle(second, S.STOPPED) and len(procs.spawns) == 2
        await second.sup.shutdown()

    run(after)
    third = make_rig(tmp_path, procs=procs, settings=first.settings)

    async def again() -> None:
        await third.sup.start()
        await until(lambda: idle(third, S.STOPPED), 5.0, "the next start-up to settle")
        assert len(procs.spawns) == 2, "it launched again"
        assert "an operator stopped the server" in third.sup.state_reason
        await third.sup.shutdown()

    run(again)


class _HeldAdoptionProbe(FakeHealth):
    """The adopting daemon's readiness probe (its second /health_generate) is held until
    the test lets it answer."""

    def __init__(self, procs: FakeProcessOps) -> None:
        super().__init__(procs)
        self.probes = 0
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def generate_ok(self, url: str, timeout_s: float) -> Probe:
        self.probes += 1
        if self.probes == 2:
            self.asked.set()
            await self.answer.wait()
        return await super().generate_ok(url, timeout_s)


def test_a_cancel_during_the_adoptions_readiness_probe_is_honoured(tmp_path: Path) -> None:
    """Issue 27 §7: the cancel arrives while the adopting daemon's readiness probe is in
    flight and the probe then answers 200. Honoured: the adopted server is torn down and
    the operator's stop recorded (before, the operation ended succeeded, no note)."""
    procs = FakeProcessOps(FakeProbe())
    first = make_rig(tmp_path, procs=procs)
    run(first.start_ready)  # then the daemon dies: no shutdown
    adopted = procs.handles[0]
    health = _HeldAdoptionProbe(procs)
    second = make_rig(tmp_path, procs=procs, settings=first.settings, health=health)

    async def after() -> None:
        await second.sup.start()
        op = second.sup.operation
        assert op is not None
        await asyncio.wait_for(health.asked.wait(), 5)
        assert second.sup.state == S.STARTING and "adopting" in second.sup.state_reason
        assert second.sup.request_cancel(op.id) is op
        health.answer.set()
        await settle(second, op)
        assert op.state == FAILED, op.error
        assert f"the adopted server (pid {adopted.pid}) was torn down" in (op.error or "")
        assert idle(second, S.STOPPED) and adopted.returncode is not None
        await second.sup.shutdown()

    run(after)
    third = make_rig(tmp_path, procs=procs, settings=first.settings)

    async def again() -> None:
        await third.sup.start()
        await until(lambda: idle(third, S.STOPPED), 5.0, "the next start-up to settle")
        assert len(procs.spawns) == 1, "it launched again"
        await third.sup.shutdown()

    run(again)
