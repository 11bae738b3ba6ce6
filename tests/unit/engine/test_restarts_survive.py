"""The server's restarts and its crash-loop window survive a daemon restart (issue 28 §6):
a server that crashed twice, then is adopted by a new daemon, still shows two restarts,
and its third crash within the window is the crash loop (``crash_loop_count`` 3), not a
first crash again. Before, each daemon started the count at 0, so a server that crashed
together with its daemon never reached the limit."""

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
