"""Promises an independent review broke by hand without any test noticing (issue 21 §5):
a liveness result about an earlier server, the backoff's doubling, the rollback's return
to the router. Each runs on a ``FakeClock`` (the engine's clock decides when a liveness
probe or a backoff is due) and, where a router is involved, a fake router."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sglang_supervisor.engine import transaction
from sglang_supervisor.engine.boundaries import pause as real_pause
from sglang_supervisor.observe.health import Probe
from sglang_supervisor.operations import ROLLED_BACK, SUCCEEDED, Operation
from sglang_supervisor.phases import OpKind
from tests.unit.engine.common import S, apply, idle, ops_of, settle
from tests.unit.engine.test_router_steps import FakeRouter
from tests.unit.fakes import (
    Behaviour,
    FakeClock,
    FakeHealth,
    FakeProbe,
    FakeProcessOps,
    make_rig,
    run,
    until,
)


class HeldHealth(FakeHealth):
    """``FakeHealth`` whose next /health_generate probe (after ``hold_next()``) hangs
    until ``answer()``, then fails: a liveness probe that outlives the server it asked."""

    def __init__(self, procs: object) -> None:
        super().__init__(procs)  # type: ignore[arg-type]
        self._hold = False
        self.held_probe: asyncio.Event | None = None
        self.asked_pid: int | None = None

    def hold_next(self) -> None:
        self._hold = True

    def answer(self) -> None:
        assert self.held_probe is not None
        self.held_probe.set()

    async def generate_ok(self, url: str, timeout_s: float) -> Probe:
        if not self._hold:
            return await super().generate_ok(url, timeout_s)
        self._hold = False
        handle = self.procs.current()
        self.asked_pid = None if handle is None else handle.pid
        self.held_probe = asyncio.Event()
        await self.held_probe.wait()
        return Probe(False, f"GET {url}/health_generate timed out after {timeout_s}s")


def test_a_failed_liveness_probe_of_the_earlier_server_is_not_held_against_the_new_one(
    tmp_path: Path,
) -> None:
    # One failed probe is enough to call a server hung: a stale result would restart B.
    clock = FakeClock()
    procs = FakeProcessOps(FakeProbe())
    health = HeldHealth(procs)
    rig = make_rig(
        tmp_path,
        procs=procs,
        health=health,
        clock=clock,
        liveness_failures=1,
        liveness_interval_s=5.0,
    )
    interval = rig.settings.timeouts.liveness_interval_s

    async def main() -> None:
        await rig.start_ready()
        first = rig.procs.handles[0]
        health.hold_next()
        clock.sleep(interval)  # a liveness probe of the first server is due
        await until(lambda: health.held_probe is not None, what="a liveness probe of pid A")
        assert health.asked_pid == first.pid
        # The first server crashes while its probe hangs; the recovery starts a new one.
        rig.procs.crash(first)
        await until(lambda: rig.sup.restarts == 1 and idle(rig, S.READY))
        second = rig.procs.handles[1]
        assert rig.procs.current() is second
        probes_before = second.probes
        # Only now does the probe about the first server come back, failed.
        health.answer()
        clock.sleep(interval)  # and the next probe (of the new server) is due
        await until(
            lambda: second.probes > probes_before or len(ops_of(rig, OpKind.RECOVER)) > 1,
            what="the watcher to look at the stale result and probe the new server",
        )
        assert rig.sup.restarts_by_reason == {"crash": 1}, rig.sup.restarts_by_reason
        assert len(ops_of(rig, OpKind.RECOVER)) == 1
        assert rig.sup.state == S.READY
        assert rig.procs.current() is second  # the new server's pid is unchanged
        assert rig.sup.watch.liveness_failures == 0
        await rig.sup.shutdown()

    run(main)


def test_backoff_doubles_after_each_failure_up_to_backoff_max_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    rig = make_rig(
        tmp_path,
        clock=clock,
        backoff_initial_s=1.0,
        backoff_max_s=8.0,
        crash_loop_count=6,
        crash_loop_window_s=600.0,
    )
    waits: list[float] = []

    async def backoff_on_the_fake_clock(stop: object, op: Operation, seconds: float) -> None:
        waits.append(seconds)
        clock.sleep(seconds)  # the wait passes at once on the fake clock
        await real_pause(rig.sup.stop_request, op, 0)  # a cancel or shutdown is still honoured

    # transaction.pause is the backoff's wait (the only pause of transaction.py).
    monkeypatch.setattr(transaction, "pause", backoff_on_the_fake_clock)

    async def main() -> None:
        await rig.start_ready()
        # The crash, then four relaunches that exit at once, then one that serves.
        rig.procs.plan(*[Behaviour(exit_on_start=1)] * 4)
        rig.procs.crash(rig.procs.handles[0])
        await until(lambda: rig.sup.restarts == 1 and idle(rig, S.READY))
        assert waits == [1.0, 2.0, 4.0, 8.0, 8.0]
        (recover,) = ops_of(rig, OpKind.RECOVER)
        assert recover.state == SUCCEEDED
        details = [p.detail for p in recover.phases if p.name == "backoff"]
        assert [d.split(" after:")[0] for d in details] == [
            "waited 1.0s",
            "waited 2.0s",
            "waited 4.0s",
            "waited 8.0s",
            "waited 8.0s",
        ]
        await rig.sup.shutdown()

    run(main)


def test_a_rollback_puts_the_last_good_server_back_in_the_router(tmp_path: Path) -> None:
    router = FakeRouter()
    rig = make_rig(tmp_path, router=router)

    async def main() -> None:
        await rig.start_ready()
        assert router.listed
        old_argv = rig.procs.spawns[0].argv
        rig.procs.plan(Behaviour(exit_on_start=1))  # the new levers' server exits at once
        op = await apply(rig, {"mem_fraction_static": 0.7})
        assert op.state == ROLLED_BACK, op.error
        assert rig.sup.state == S.READY
        assert rig.procs.spawns[-1].argv == old_argv  # the last-good levers serve again
        assert router.listed, "the last-good server serves, but not in the router"
        names = [p.name for p in op.phases]
        assert "rollback_router_add" in names, names
        await rig.sup.shutdown()

    run(main)


def test_liveness_failures_of_an_earlier_server_never_count_against_a_new_one(
    tmp_path: Path,
) -> None:
    """Two failed probes in a row call a server hung. The first server fails one, an
    operator restarts it, and the new server fails one, then answers: that is one failure
    of the new server, not the second in a row (the watcher counts per server)."""
    clock = FakeClock()
    rig = make_rig(tmp_path, clock=clock, liveness_failures=2, liveness_interval_s=5.0)
    interval = rig.settings.timeouts.liveness_interval_s

    async def main() -> None:
        await rig.start_ready()
        first = rig.procs.handles[0]
        first.hung = True
        clock.sleep(interval)
        await until(lambda: rig.sup.watch.liveness_failures == 1, what="one failed probe of A")
        first.hung = False  # it only needs the restart now
        await settle(rig, await rig.sup.submit_restart())
        second = rig.procs.handles[1]
        assert rig.procs.current() is second and idle(rig, S.READY)
        second.hung = True
        before = second.probes
        clock.sleep(interval)  # one probe of the new server is due, and fails
        await until(lambda: second.probes > before, what="a probe of the new server")
        second.hung = False
        # The next probe starts only once the failed one has been judged (and not while
        # a recovery runs): either it runs, or the failure was taken for the second.
        clock.sleep(interval)
        await until(
            lambda: second.probes > before + 1 or bool(ops_of(rig, OpKind.RECOVER)),
            what="the next probe of the new server, or a recovery",
        )
        assert not ops_of(rig, OpKind.RECOVER), "one failed probe of B was taken for two"
        assert rig.sup.restarts_by_reason == {}
        assert rig.procs.current() is second
        await rig.sup.shutdown()

    run(main)
