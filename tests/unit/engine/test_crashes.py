"""A ready server that crashes or hangs: backoff, restart, crash loop.

Each test runs one scenario on a fresh event loop against a fake host (``tests.unit.fakes``):
GPUs whose memory is held by the ranks of fake launches, a process table the Supervisor
tears down, and health probes that follow the serving launch. Assertions are about what
an operator would notice: which levers serve, whether the GPUs are free, what the
operation and the error say.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_supervisor.operations import FAILED, RUNNING, SUCCEEDED
from sglang_supervisor.phases import OpKind
from sglang_supervisor.sglang.levers import LeverError
from tests.unit.engine.common import (
    S,
    apply,
    idle,
    nothing_held,
    ops_of,
    settle,
    state_of,
)
from tests.unit.fakes import (
    INITIAL_LEVERS,
    Behaviour,
    make_rig,
    run,
    until,
)

# ----------------------------------------------------------------- crashes


def test_crash_while_ready_backs_off_and_restarts_the_same_levers(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        first = rig.procs.handles[0]
        # The launcher dies alone: its ranks are orphaned and keep their memory.
        rig.procs.crash(first, returncode=-9, orphan_ranks=True)
        await until(lambda: rig.sup.restarts == 1 and idle(rig, S.READY))
        assert rig.sup.restarts_by_reason == {"crash": 1}
        assert rig.transitions()[2:] == [
            ("ready", "stopping"),
            ("stopping", "releasing"),
            ("releasing", "backoff"),
            ("backoff", "starting"),
            ("starting", "ready"),
        ]
        (recover,) = ops_of(rig, OpKind.RECOVER)
        assert recover.state == SUCCEEDED
        assert "killed by SIGKILL" in (recover.rollback_reason or "")
        # The orphaned ranks were killed and their memory freed before the relaunch.
        assert not (rig.procs.alive_pids() & set(first.rank_pids))
        assert rig.procs.spawns[1].gpu_held_at_spawn == {0: 0, 1: 0}
        assert rig.procs.spawns[1].argv == rig.procs.spawns[0].argv
        assert (await rig.sup.status())["levers"] == INITIAL_LEVERS
        await rig.sup.shutdown()

    run(main)


def test_transition_backoff_to_failed_on_a_crash_loop(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(exit_on_start=1), Behaviour(exit_on_start=1))
        rig.procs.crash(rig.procs.handles[0])
        await until(lambda: idle(rig, S.FAILED))
        assert rig.sup.state_reason.startswith("crash loop: 3 failures")
        assert "POST /start" in rig.sup.state_reason
        (recover,) = ops_of(rig, OpKind.RECOVER)
        assert recover.state == FAILED
        assert "crash loop" in (recover.error or "")
        assert rig.transitions()[-1] == ("backoff", "failed")
        assert rig.sup.restarts == 0
        assert nothing_held(rig)
        # An operator's start brings it back.
        start = await settle(rig, await rig.sup.submit_start())
        assert start.state == SUCCEEDED
        assert state_of(rig) == S.READY
        await rig.sup.shutdown()

    run(main)


def test_a_crash_after_an_operator_start_from_failed_is_restarted(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(exit_on_start=1), Behaviour(exit_on_start=1))
        rig.procs.crash(rig.procs.handles[0])
        await until(lambda: idle(rig, S.FAILED))
        await settle(rig, await rig.sup.submit_start())
        assert state_of(rig) == S.READY
        # The operator fixed the cause; much later, one unrelated crash.
        rig.procs.crash(rig.procs.handles[-1])
        await until(
            lambda: (
                len(ops_of(rig, OpKind.RECOVER)) == 2 and ops_of(rig, OpKind.RECOVER)[1].finished
            )
        )
        assert state_of(rig) == S.READY
        assert rig.sup.restarts == 1

    run(main)


def test_hung_server_is_restarted_after_failed_liveness_probes(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        hung = rig.procs.handles[0]
        hung.hung = True
        await until(lambda: rig.sup.restarts == 1 and idle(rig, S.READY))
        assert rig.sup.restarts_by_reason == {"hung": 1}
        (recover,) = ops_of(rig, OpKind.RECOVER)
        assert "2 consecutive liveness probes failed" in (recover.rollback_reason or "")
        # The hung tree was torn down (it had not exited on its own).
        assert not (rig.procs.alive_pids() & {hung.pid, *hung.rank_pids})
        assert rig.procs.current() is rig.procs.handles[1]
        await rig.sup.shutdown()

    run(main)


def test_transition_backoff_to_stopping_when_an_apply_preempts_the_restart(
    tmp_path: Path,
) -> None:
    rig = make_rig(tmp_path, backoff_initial_s=5.0, backoff_max_s=5.0)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.crash(rig.procs.handles[0])
        await until(lambda: rig.sup.state == S.BACKOFF)
        op = await apply(rig, {"mem_fraction_static": 0.7})
        assert op.state == SUCCEEDED
        assert ("backoff", "stopping") in rig.transitions()
        (recover,) = ops_of(rig, OpKind.RECOVER)
        assert recover.state == FAILED
        assert "superseded" in (recover.error or "")
        assert (await rig.sup.status())["levers"]["mem_fraction_static"] == 0.7
        await rig.sup.shutdown()

    run(main)


def test_an_invalid_apply_during_backoff_does_not_cancel_the_restart(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, backoff_initial_s=0.2, backoff_max_s=0.2)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.crash(rig.procs.handles[0])
        await until(lambda: rig.sup.state == S.BACKOFF)
        with pytest.raises(LeverError):
            await rig.sup.submit_apply({"mem_fraction": 0.9}, {})
        (recover,) = ops_of(rig, OpKind.RECOVER)
        assert recover.state == RUNNING, recover.error
        await until(lambda: idle(rig, S.READY), timeout=2.0)

    run(main)
