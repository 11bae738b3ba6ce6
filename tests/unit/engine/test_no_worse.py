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

from api.app import create_app
from supervisor.engine import NotCancellable
from supervisor.operations import ROLLED_BACK, Operation
from supervisor.phases import PhaseName, PhasePrefix, prefixed
from tests.unit.engine.common import HELD_PER_RANK, S, settle, state_of
from tests.unit.fakes import INITIAL_LEVERS, Behaviour, make_rig, run, until

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
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
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
