"""What an operator of a multi-node allocation tripped on at a daemon's start (issue 28 §6),
over the fakes.

The server's restarts and its crash-loop window survive a daemon restart: a server that
crashed twice, then is adopted by a new daemon, still shows two restarts, and its third
crash within the window is the crash loop (``crash_loop_count`` 3), not a first crash
again (each daemon started the count at 0). A start refused by a process not ours on a
GPU says so in the state's reason and is retried with back-off until the GPU is clean
(it stayed stopped). The same on the real cluster: tests/slurm/test_batch.py,
tests/slurm/test_slurm_daemon.py."""

from __future__ import annotations

from pathlib import Path

from tests.unit.engine.common import S, idle
from tests.unit.fakes import FakeProbe, FakeProcessOps, make_rig, run, until


def test_restarts_and_the_crash_loop_window_survive_adoption(tmp_path: Path) -> None:
    procs = FakeProcessOps(FakeProbe())
    first = make_rig(tmp_path, procs=procs)

    async def before() -> None:
        await first.start_ready()
        for n in (1, 2):
            procs.crash(procs.handles[-1])
            await until(lambda n=n: first.sup.restarts == n and idle(first, S.READY))
        # then the daemon dies (no shutdown): the server keeps serving

    run(before)
    serving = procs.handles[-1]
    second = make_rig(tmp_path, procs=procs, settings=first.settings)

    async def after() -> None:
        await second.start_ready()
        status = await second.sup.status()
        assert status["server"]["pid"] == serving.pid  # adopted, not restarted
        assert status["restarts"] == 2
        assert status["restarts_by_reason"] == {"crash": 2}
        procs.crash(serving)  # the third within the window: the crash loop
        await until(lambda: idle(second, S.FAILED))
        assert "crash loop: 3 failures" in (await second.sup.status())["state_reason"]
        await second.sup.shutdown()

    run(after)


def test_a_start_refused_by_a_foreign_process_says_why_and_is_retried(tmp_path: Path) -> None:
    """A dirty GPU at the daemon's start (issue 28 §6): the state's reason names the pid
    (it said "daemon started", the refusal only in last_operation.error), /status
    start_refused and the metric say so, and once the process leaves the start is retried
    with back-off, without an operator (it stayed stopped while the allocation was held)."""
    from sglang_supervisor.observe.metrics import SupervisorMetrics
    from tests.unit.fakes import GIB

    rig = make_rig(tmp_path)
    rig.probe.hold(99_999, 0, 10 * GIB)  # another user's job on GPU 0

    async def main() -> None:
        await rig.sup.start()
        await until(lambda: rig.sup.operation is None and rig.sup.state_reason != "daemon started")
        status = await rig.sup.status()
        assert status["state"] == "stopped"
        assert "pid 99999 holds 10.0 GiB on GPU 0" in status["state_reason"]
        assert "the start is retried" in status["state_reason"]
        assert status["start_refused"] == status["state_reason"]
        text = SupervisorMetrics(rig.sup).render(rig.sup.view()).decode()
        assert "sglang_supervisor_start_refused 1.0" in text
        await until(lambda: "look 2" in rig.sup.state_reason)  # still there: looked again
        assert rig.procs.spawns == [] and 99_999 in rig.probe.holders  # never killed
        rig.probe.free(99_999)
        await until(lambda: idle(rig, S.READY))
        assert (await rig.sup.status())["start_refused"] is None
        await rig.sup.shutdown()

    run(main)
