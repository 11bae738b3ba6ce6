"""/status's member pids come from a cached /proc scan run in a worker thread: a scan
that a transition overtook must not be kept, or /status would call the new server's
ranks foreign for up to a second after a restart."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from tests.unit.engine.common import S, idle
from tests.unit.fakes import make_rig, run, until


def test_a_member_scan_overtaken_by_a_restart_is_not_shown_after_it(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    members = rig.procs.members
    scanned = threading.Event()
    let_go = threading.Event()
    hold = [False]

    def slow_scan(*args: Any, **kw: Any) -> set[int]:
        found = members(*args, **kw)
        if hold[0]:  # the first scan: taken before the crash, returned after the restart
            hold[0] = False
            scanned.set()
            let_go.wait(10)
        return found

    rig.procs.members = slow_scan  # type: ignore[method-assign]

    async def main() -> None:
        await rig.start_ready()
        first = rig.procs.handles[0]
        hold[0] = True
        early = asyncio.create_task(rig.sup.status())
        await until(scanned.is_set, what="the /status scan of the first server")
        rig.procs.crash(first)
        await until(lambda: rig.sup.restarts == 1 and idle(rig, S.READY))
        second = rig.procs.handles[1]
        let_go.set()
        await early
        status = await rig.sup.status()
        shown = {p["pid"]: p["member"] for g in status["gpus"] for p in g["processes"]}
        assert set(shown) == set(second.rank_pids)
        assert all(shown.values()), f"the new server's ranks shown as foreign: {shown}"
        await rig.sup.shutdown()

    run(main)
