"""Shutdown and cancel are requests honoured at phase boundaries.

A thread-backed OS step (spawn, teardown, release wait) is never cancelled midway: a
shutdown during an apply waits for the step in progress, runs no second teardown beside
it, and leaves no server of ours alive once ``shutdown()`` returns. An operator's cancel
ends a hung start or a long drain at the next poll and rolls back. Each test drives the
engine through the fakes and asserts what an operator would see: pids, states, GPU
memory, which levers serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from sglang_supervisor.engine import NoSuchOperation, OperationFinished
from sglang_supervisor.engine import registry as engine_registry
from sglang_supervisor.operations import FAILED, ROLLED_BACK, SUCCEEDED
from sglang_supervisor.phases import OpKind, PhaseName
from sglang_supervisor_api.app import create_app
from tests.unit.engine.common import HELD_PER_RANK, S, nothing_held, settle, state_of
from tests.unit.fakes import (
    DEFAULT_METRICS,
    INITIAL_LEVERS,
    Behaviour,
    FakeHealth,
    FakeProbe,
    FakeProcessOps,
    make_rig,
    run,
    until,
)

BUSY_METRICS = DEFAULT_METRICS.replace(
    'sglang:num_running_reqs{model_name="fake"} 0.0',
    'sglang:num_running_reqs{model_name="fake"} 3.0',
)


# ------------------------------------------------------------------- shutdown


def test_shutdown_during_an_apply_teardown_runs_exactly_one_teardown_at_a_time(
    tmp_path: Path,
) -> None:
    """The apply's teardown is in progress (SIGTERM sent, grace running) when the daemon
    is told to stop: the shutdown waits for it, then tears down what is left."""
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        old = rig.procs.handles[0]
        gate = threading.Event()
        rig.procs.teardown_gate = gate
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        await until(lambda: rig.procs.teardowns_running == 1, what="the apply's teardown")
        shutdown = asyncio.create_task(rig.sup.shutdown())
        # Give a shutdown that does not wait every chance to start its own teardown.
        with contextlib.suppress(AssertionError):
            await until(lambda: rig.procs.teardowns_running > 1 or shutdown.done(), 0.5)
        gate.set()
        released = await shutdown
        assert rig.procs.max_concurrent_teardowns == 1
        assert released
        assert op.state == FAILED and "shut down" in (op.error or "")
        assert state_of(rig) == S.STOPPED
        assert old.returncode is not None
        assert rig.procs.alive_pids() == set()
        assert nothing_held(rig)
        # The apply never got to launch the new levers.
        assert len(rig.procs.spawns) == 1

    run(main)


def test_no_server_is_alive_after_shutdown_returns_even_with_a_slow_spawn(
    tmp_path: Path,
) -> None:
    """The new server's spawn is in progress (exec is slow) when the daemon is told to
    stop: the launch it returns is torn down before shutdown() returns."""
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        gate = threading.Event()
        rig.procs.spawn_gate = gate
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        await until(lambda: rig.procs.spawns_begun == 2, what="the new server's spawn")
        shutdown = asyncio.create_task(rig.sup.shutdown())
        # A shutdown that does not wait for the spawn returns now, with it still running.
        with contextlib.suppress(AssertionError):
            await until(shutdown.done, 0.5)
        gate.set()
        released = await shutdown
        await until(lambda: len(rig.procs.spawns) == 2, what="the spawn to return")
        new = rig.procs.handles[1]
        assert released
        assert new.returncode is not None, f"pid {new.pid} outlived shutdown()"
        assert rig.procs.alive_pids() == set()
        assert nothing_held(rig)
        assert op.state == FAILED
        assert state_of(rig) == S.STOPPED
        assert rig.procs.max_concurrent_teardowns == 1

    run(main)


def test_a_second_shutdown_request_kills_without_a_grace_period(tmp_path: Path) -> None:
    """A server that ignores SIGTERM gets SIGKILL at once when the shutdown is forced,
    instead of after stop_grace_s; release is still verified."""
    rig = make_rig(tmp_path, stop_grace_s=30.0)
    rig.procs.plan(Behaviour(ignore_sigterm=True))

    async def main() -> None:
        await rig.start_ready()
        rig.sup.request_shutdown()
        rig.sup.request_shutdown()  # the second signal
        assert await asyncio.wait_for(rig.sup.shutdown(), 10)
        (report,) = rig.procs.teardowns
        assert report.kill_after_s == 0.0
        assert report.sigkill_sent == sorted(report.members)
        assert rig.procs.alive_pids() == set()
        assert nothing_held(rig)
        assert state_of(rig) == S.STOPPED

    run(main)


def test_a_second_shutdown_request_cuts_a_grace_period_in_progress(tmp_path: Path) -> None:
    """The apply's teardown is waiting out a 30 s grace for a server that ignores SIGTERM
    when the second signal comes: SIGKILL goes out now, not when the grace ends."""
    rig = make_rig(tmp_path, stop_grace_s=30.0)
    rig.procs.plan(Behaviour(ignore_sigterm=True))

    async def main() -> None:
        await rig.start_ready()
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        await until(lambda: rig.procs.teardowns_running == 1, what="the apply's teardown")
        rig.sup.request_shutdown()
        rig.sup.request_shutdown()
        assert await asyncio.wait_for(rig.sup.shutdown(), 10)
        first = rig.procs.teardowns[0]
        assert first.sigkill_sent == sorted(first.members)
        assert first.kill_after_s is not None and first.kill_after_s < 30.0
        assert op.state == FAILED
        assert len(rig.procs.spawns) == 1  # nothing new was launched
        assert rig.procs.alive_pids() == set()
        assert nothing_held(rig)

    run(main)


def test_a_shutdown_requested_during_start_up_launches_nothing(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        rig.sup.request_shutdown()
        await rig.sup.start()
        assert await rig.sup.shutdown()
        assert rig.procs.spawns == []
        # It never looked at the GPUs: it says so rather than "stopped".
        assert state_of(rig) == S.LOADING

    run(main)


# --------------------------------------------------------------------- cancel


def test_cancel_of_a_hung_start_rolls_back_at_the_next_poll(tmp_path: Path) -> None:
    """The new server never answers /health_generate; with a 10-minute ready timeout
    the operator cancels instead of waiting: the last-good levers serve again."""
    rig = make_rig(tmp_path, ready_timeout_s=600.0)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(never_ready=True))
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        await until(lambda: len(rig.procs.spawns) == 2 and rig.procs.handles[1].probes >= 1)
        hung = rig.procs.handles[1]
        assert rig.sup.request_cancel(op.id) is op
        await settle(rig, op, timeout=5.0)
        assert op.state == ROLLED_BACK, op.error
        assert "cancelled by an operator" in (op.rollback_reason or "")
        assert hung.returncode is not None  # the hung server was torn down
        serving = rig.procs.current()
        assert serving is not None and serving is rig.procs.handles[2]
        assert state_of(rig) == S.READY
        assert (await rig.sup.status())["levers"] == INITIAL_LEVERS
        assert rig.probe.above_baseline() == {0: HELD_PER_RANK, 1: HELD_PER_RANK}
        await rig.sup.shutdown()

    run(main)


def test_cancel_during_a_drain_keeps_the_old_server_serving(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        old = rig.procs.handles[0]
        rig.health.metrics = BUSY_METRICS  # requests keep running: the drain waits
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {}, drain_timeout_s=600)
        await until(lambda: state_of(rig) == S.DRAINING)
        rig.sup.request_cancel(op.id)
        await settle(rig, op, timeout=5.0)
        assert op.state == ROLLED_BACK
        assert "nothing was stopped" in (op.error or "")
        assert state_of(rig) == S.READY
        assert rig.procs.current() is old and len(rig.procs.spawns) == 1
        assert rig.procs.teardowns == []
        assert (await rig.sup.status())["levers"] == INITIAL_LEVERS
        await rig.sup.shutdown()

    run(main)


def test_cancel_of_a_recovery_in_backoff_stops_it_and_says_so(tmp_path: Path) -> None:
    """The server crashed; the restart waits out a long backoff. The operator cancels:
    nothing is relaunched, the state says why and how to start again."""
    rig = make_rig(tmp_path, backoff_initial_s=600.0, backoff_max_s=600.0)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.crash(rig.procs.handles[0])
        await until(lambda: state_of(rig) == S.BACKOFF)
        recover = rig.sup.operation
        assert recover is not None and recover.kind == OpKind.RECOVER
        rig.sup.request_cancel(recover.id)
        await settle(rig, recover, timeout=5.0)
        assert recover.state == FAILED
        assert "cancelled by an operator" in (recover.error or "")
        assert state_of(rig) == S.FAILED
        assert "POST /start" in rig.sup.state_reason
        assert len(rig.procs.spawns) == 1
        await rig.sup.shutdown()

    run(main)


def test_cancel_of_an_unknown_or_finished_operation_is_refused(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        await settle(rig, op)
        with pytest.raises(NoSuchOperation, match="no operation 'nope'"):
            rig.sup.request_cancel("nope")
        with pytest.raises(OperationFinished, match=f"{op.id} .* already ended succeeded"):
            rig.sup.request_cancel(op.id)
        assert op.state == SUCCEEDED
        await rig.sup.shutdown()

    run(main)


def test_cancel_route_answers_202_404_409(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, ready_timeout_s=600.0)

    async def main() -> None:
        await rig.start_ready()
        app = create_app(rig.sup)
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers={"Content-Type": "application/json"}
        ) as client:
            rig.procs.plan(Behaviour(never_ready=True))
            r = await client.post("/levers", json={"levers": {"mem_fraction_static": 0.9}})
            op_id = r.json()["operation"]["id"]
            await until(lambda: len(rig.procs.spawns) == 2)
            r = await client.post(f"/operations/{op_id}/cancel")
            assert r.status_code == 202, r.text
            assert r.json()["operation"]["id"] == op_id
            r = await client.post(f"/operations/{op_id}/cancel?wait=true")
            assert r.status_code == 200, r.text
            assert r.json()["operation"]["state"] == "rolled_back"
            r = await client.post(f"/operations/{op_id}/cancel")
            assert r.status_code == 409
            assert "already ended rolled_back" in r.json()["detail"]["message"]
            r = await client.post("/operations/0123456789ab/cancel")
            assert r.status_code == 404
        await until(lambda: rig.sup.operation is None)
        await rig.sup.shutdown()

    run(main)


# --------------------------------------------------------------- bounded growth


def test_dry_runs_count_toward_the_operation_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dry runs are kept for GET /operations/{id} like any other, within the same cap;
    an operation still running is never the one dropped."""
    cap = 20  # MAX_OPERATIONS (200) dry runs take long on a busy machine; the rule is the same
    monkeypatch.setattr(engine_registry, "MAX_OPERATIONS", cap)
    rig = make_rig(tmp_path, ready_timeout_s=600.0)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(never_ready=True))
        running = await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        first = None
        for i in range(cap + 10):
            op = await rig.sup.submit_apply({"max_running_requests": 100 + i}, {}, dry_run=True)
            first = first or op
        assert len(rig.sup.operations) == cap
        assert rig.sup.get_operation(running.id) is running
        assert first is not None and rig.sup.get_operation(first.id) is None
        assert rig.sup.get_operation(op.id) is op
        await until(lambda: len(rig.procs.spawns) == 2, what="the hung launch")
        rig.sup.request_cancel(running.id)
        await settle(rig, running)
        await rig.sup.shutdown()

    run(main)


class _SlowServerInfo(FakeHealth):
    """``/server_info`` (asked right after the server is ready) waits for the test."""

    def __init__(self, procs: FakeProcessOps) -> None:
        super().__init__(procs)
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def server_info(
        self, url: str, timeout_s: float, headers: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        if self.procs.handles and len(self.procs.handles) == 2:
            self.asked.set()
            await self.answer.wait()
        return await super().server_info(url, timeout_s)


def test_a_cancel_too_late_to_end_an_operation_is_said_not_dropped(tmp_path: Path) -> None:
    """Issue 27 §7: a cancel accepted after an apply's last step that could end it (its
    server ready, no probation left) cannot be honoured; the operation says so in a
    ``cancel`` phase instead of ending ``succeeded`` as if none had come."""
    probe = FakeProbe()
    procs = FakeProcessOps(probe)
    health = _SlowServerInfo(procs)
    rig = make_rig(tmp_path, procs=procs, health=health, probation_s=0.0)

    async def main() -> None:
        await rig.start_ready()
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        await asyncio.wait_for(health.asked.wait(), 5)
        assert rig.sup.request_cancel(op.id) is op  # accepted: the operation still runs
        health.answer.set()
        await settle(rig, op)
        assert op.state == SUCCEEDED, op.error
        (late,) = [p for p in op.phases if p.name == PhaseName.CANCEL]
        assert late.state == FAILED
        assert "cancelled by an operator" in late.detail and "not honoured" in late.detail
        assert "the operation ended succeeded" in late.detail
        assert rig.sup.levers.levers["mem_fraction_static"] == 0.9
        await rig.sup.shutdown()

    run(main)
