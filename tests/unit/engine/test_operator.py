"""An operator's stop and start.

Each test runs one scenario on a fresh event loop against a fake host (``tests.unit.fakes``):
GPUs whose memory is held by the ranks of fake launches, a process table the Supervisor
tears down, and health probes that follow the serving launch. Assertions are about what
an operator would notice: which levers serve, whether the GPUs are free, what the
operation and the error say.
"""

from __future__ import annotations

from pathlib import Path

from sglang_supervisor.operations import SUCCEEDED
from tests.unit.engine.common import (
    S,
    nothing_held,
    phase_detail,
    settle,
    state_of,
)
from tests.unit.fakes import (
    make_rig,
    run,
)

# ------------------------------------------------------- operator stop/start


def test_operator_stop_then_start(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        stop = await settle(rig, rig.sup.submit_stop())
        assert stop.state == SUCCEEDED
        assert state_of(rig) == S.STOPPED
        assert rig.sup.server is None
        assert nothing_held(rig)
        assert rig.transitions()[-3:] == [
            ("ready", "stopping"),
            ("stopping", "releasing"),
            ("releasing", "stopped"),
        ]
        start = await settle(rig, await rig.sup.submit_start())
        assert start.state == SUCCEEDED
        assert state_of(rig) == S.READY
        assert rig.procs.spawns[1].argv == rig.procs.spawns[0].argv
        again = await settle(rig, await rig.sup.submit_start())
        assert phase_detail(again, "start") == "already ready; nothing to do"
        assert len(rig.procs.spawns) == 2
        await rig.sup.shutdown()

    run(main)
