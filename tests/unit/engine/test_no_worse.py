"""Issue 20 §7: a cancel, a crash or a late signal never makes things worse.

Each test drives the engine through the fakes (``tests.unit.fakes``) and asserts what an
operator sees: which levers serve, the state, the operation's outcome and message, and
what is persisted for the next daemon.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from sglang_supervisor.engine import NotCancellable
from sglang_supervisor.operations import FAILED, ROLLED_BACK, Operation
from sglang_supervisor.phases import OpKind, PhaseName, PhasePrefix, prefixed
from sglang_supervisor.store import Store
from sglang_supervisor_api.app import create_app
from tests.unit.engine.common import (
    HELD_PER_RANK,
    S,
    launched,
    nothing_held,
    settle,
    state_of,
)
from tests.unit.fakes import (
    INITIAL_LEVERS,
    Behaviour,
    FakeProbe,
    FakeProcessOps,
    make_rig,
    run,
    until,
)

ROLLBACK_START = prefixed(PhasePrefix.ROLLBACK, PhaseName.START)


def test_a_cancel_during_the_rollback_is_refused_and_the_last_good_levers_serve(
    tmp_path: Path,
) -> None:
    """Apply fails at start; the operator cancels while the last-good server is being
    started again. Before: that server was torn down, ``failed``, nothing served. Now:
    409 saying a rollback cannot be cancelled, and the rollback ends ``rolled_back``."""
    rig = make_rig(tmp_path, ready_timeout_s=600.0)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(
            Behaviour(exit_on_start=1, log_lines=["RuntimeError: capture failed"]),
            Behaviour(hold_ready=True),  # the rollback's start: slow, as on a real GPU
        )
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.99}, {})
        await until(lambda: len(rig.procs.spawns) == 3, what="the rollback's launch")
        assert any(p.name == ROLLBACK_START for p in op.phases)
        with pytest.raises(NotCancellable, match="rollback to the last-good levers has begun"):
            rig.sup.request_cancel(op.id)
        app = create_app(rig.sup)
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers={"Content-Type": "application/json"}
        ) as client:
            r = await client.post(f"/operations/{op.id}/cancel")
        assert r.status_code == 409, r.text
        assert "cannot be cancelled now" in r.json()["detail"]["message"]
        assert r.json()["detail"]["operation"]["state"] == "running"
        rig.procs.handles[2].held = False  # the last-good server finishes loading
        await settle(rig, op, timeout=5.0)
        assert op.state == ROLLED_BACK, op.error
        assert state_of(rig) == S.READY
        assert rig.procs.current() is rig.procs.handles[2]
        assert (await rig.sup.status())["levers"] == INITIAL_LEVERS
        assert rig.probe.above_baseline() == {0: HELD_PER_RANK, 1: HELD_PER_RANK}
        await rig.sup.shutdown()

    run(main)


def test_a_cancel_sent_right_after_the_failed_start_does_not_stop_the_rollback(
    tmp_path: Path,
) -> None:
    """The cancel arrives between the failed start and the rollback's launch (7 of 7 in
    the issue's random run ended ``failed``): rolling back is what it asked for."""
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(exit_on_start=1))
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.99}, {})
        accepted = []
        forward = op.listener

        def cancel_when_the_start_fails(o: Operation, phase: dict[str, Any]) -> None:
            if forward is not None:
                forward(o, phase)
            if phase["name"] == PhaseName.START and phase["state"] == "failed":
                accepted.append(rig.sup.request_cancel(o.id))  # the operator's click lands

        op.listener = cancel_when_the_start_fails
        await settle(rig, op, timeout=5.0)
        assert accepted == [op]  # accepted (202): nothing was rolling back yet
        assert op.state == ROLLED_BACK, op.error
        assert state_of(rig) == S.READY
        assert (await rig.sup.status())["levers"] == INITIAL_LEVERS
        await rig.sup.shutdown()

    run(main)


def test_an_operators_stop_is_recorded_before_it_stops_anything(tmp_path: Path) -> None:
    """Before: ``stopped_by`` was written once the stop had completed, so a daemon that
    died mid-stop left no trace of it and its successor launched the server again."""
    rig = make_rig(tmp_path, stop_grace_s=1.0)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.handles[0].behaviour.ignore_sigterm = True  # a teardown that takes a while
        op = rig.sup.submit_stop()
        await until(lambda: state_of(rig) == S.STOPPING, what="the stop's teardown")
        assert Store(tmp_path).load().stopped_by == op.id
        await settle(rig, op, timeout=5.0)
        await rig.sup.shutdown()

    run(main)


def test_a_daemon_that_died_mid_stop_is_succeeded_by_one_that_finishes_the_stop(
    tmp_path: Path,
) -> None:
    """The stop was recorded, the daemon died before its teardown: the server still
    runs. The next daemon must not adopt it (the operator asked for a stop): it tears it
    down and stays stopped until an operator starts it."""
    procs = FakeProcessOps(FakeProbe())
    first = make_rig(tmp_path, procs=procs)

    async def before() -> None:
        await first.start_ready()
        await first.sup.journal.record_operator_stop("op-the-operator-sent")
        # The loop ends here without shutdown(): the daemon was SIGKILLed mid-stop.

    run(before)
    alive = procs.handles[0]
    assert alive.returncode is None
    second = make_rig(tmp_path, procs=procs, settings=first.settings)

    async def after() -> None:
        await second.sup.start()
        op = second.sup.operation
        assert op is not None
        await settle(second, op)
        assert alive.returncode is not None  # torn down, not adopted
        assert len(procs.spawns) == 1  # nothing launched
        status = await second.sup.status()
        assert status["state"] == "stopped" and status["server"] is None
        assert "op-the-operator-sent" in str([p.detail for p in op.phases])
        assert nothing_held(second)
        await second.sup.shutdown()

    run(after)


def test_cancelling_the_daemons_own_start_up_launch_stops_it_honestly(tmp_path: Path) -> None:
    """Before: accepted (202), then relaunched after a backoff counted as a crash, and the
    operation ended ``succeeded``. Now: torn down, stopped, the operation says cancelled,
    nothing relaunched."""
    rig = make_rig(tmp_path, ready_timeout_s=600.0, backoff_initial_s=0.01)

    async def main() -> None:
        rig.procs.plan(Behaviour(hold_ready=True))  # a model load that takes minutes
        await rig.sup.start()
        op = rig.sup.operation
        assert op is not None and op.kind == OpKind.START
        await until(lambda: launched(rig, 1), what="the start-up launch")
        assert rig.sup.request_cancel(op.id) is op
        await settle(rig, op, timeout=5.0)
        assert op.state == FAILED
        assert "cancelled by an operator" in (op.error or "")
        assert "stays stopped" in (op.error or "")
        assert PhaseName.BACKOFF not in [p.name for p in op.phases]
        assert rig.procs.handles[0].returncode is not None
        assert len(rig.procs.spawns) == 1  # no relaunch
        assert state_of(rig) == S.STOPPED and rig.sup.restarts == 0
        assert not rig.sup.crash_times
        status = await rig.sup.status()
        assert status["server"] is None
        assert nothing_held(rig)
        assert Store(tmp_path).load().stopped_by == op.id
        await rig.sup.shutdown()

    run(main)


def test_cancelling_the_probation_an_adopting_daemon_finishes_rolls_it_back(
    tmp_path: Path,
) -> None:
    """The daemon died in an apply's probation; the next one adopts the new server and
    watches the rest of it; the operator cancels. Before: the untested server kept
    serving while /status showed the last-good levers, the pending apply stayed, and the
    next restart committed the cancelled levers."""
    procs = FakeProcessOps(FakeProbe())
    first = make_rig(tmp_path, procs=procs, probation_s=30.0)

    async def before() -> None:
        await first.start_ready()
        await first.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        await until(lambda: len(procs.spawns) == 2 and first.sup.state == S.READY)
        # The loop ends here, in probation, without shutdown(): the daemon was SIGKILLed.

    run(before)
    untested = procs.handles[1]
    second = make_rig(tmp_path, procs=procs, settings=first.settings)

    async def after() -> None:
        await second.sup.start()
        op = second.sup.operation
        assert op is not None
        await until(lambda: any(p.name == PhaseName.PROBATION for p in op.phases))
        second.sup.request_cancel(op.id)
        await settle(second, op, timeout=5.0)
        assert op.state == ROLLED_BACK, op.error
        assert "cancelled by an operator" in (op.rollback_reason or "")
        assert untested.returncode is not None  # the untested server no longer serves
        serving = procs.current()
        assert serving is procs.handles[2]
        argv = procs.spawns[2].argv
        assert argv[argv.index("--mem-fraction-static") + 1] == "0.8"
        status = await second.sup.status()
        assert status["levers"] == INITIAL_LEVERS
        persisted = Store(tmp_path).load()
        assert persisted.pending_operation is None
        assert persisted.last_good is not None
        assert dict(persisted.last_good.levers) == INITIAL_LEVERS
        await second.sup.shutdown(keep_server=True)

    run(after)
    third = make_rig(tmp_path, procs=procs, settings=first.settings)

    async def later() -> None:
        await third.start_ready()  # adopts the last-good server; commits nothing cancelled
        assert (await third.sup.status())["levers"] == INITIAL_LEVERS
        await third.sup.shutdown()

    run(later)


def test_a_sigkill_of_the_rollbacks_launcher_is_retried_once(tmp_path: Path) -> None:
    """Before: an external SIGKILL of the last-good launcher ended the apply ``failed``
    with nothing serving. The last-good levers served before: one more try."""
    rig = make_rig(tmp_path, ready_timeout_s=600.0)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(exit_on_start=1), Behaviour(hold_ready=True))
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.99}, {})
        await until(lambda: launched(rig, 3), what="the rollback's launch")
        rig.procs.crash(rig.procs.handles[2], returncode=-9)  # kill -9 from outside
        await settle(rig, op, timeout=5.0)
        assert op.state == ROLLED_BACK, op.error
        assert len(rig.procs.spawns) == 4
        assert rig.procs.current() is rig.procs.handles[3]
        assert state_of(rig) == S.READY
        assert (await rig.sup.status())["levers"] == INITIAL_LEVERS
        await rig.sup.shutdown()

    run(main)


def test_the_retry_of_the_rollback_is_bounded(tmp_path: Path) -> None:
    """Killed twice: ``failed`` after exactly one retry, both reasons named."""
    rig = make_rig(tmp_path, ready_timeout_s=600.0)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(
            Behaviour(exit_on_start=1), Behaviour(hold_ready=True), Behaviour(hold_ready=True)
        )
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.99}, {})
        for n in (3, 4):
            await until(lambda n=n: launched(rig, n), what=f"launch {n}")  # type: ignore[misc]
            rig.procs.crash(rig.procs.handles[n - 1], returncode=-9)
        await settle(rig, op, timeout=5.0)
        assert op.state == FAILED
        assert len(rig.procs.spawns) == 4
        assert "the second try" in (op.error or "")
        assert state_of(rig) == S.FAILED
        assert nothing_held(rig)
        await rig.sup.shutdown()

    run(main)
