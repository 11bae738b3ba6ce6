"""The daemon's shutdown.

Each test runs one scenario on a fresh event loop against a fake host (``tests.unit.fakes``):
GPUs whose memory is held by the ranks of fake launches, a process table the Supervisor
tears down, and health probes that follow the serving launch. Assertions are about what
an operator would notice: which levers serve, whether the GPUs are free, what the
operation and the error say.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_supervisor.engine import Busy
from sglang_supervisor.operations import FAILED, SUCCEEDED
from sglang_supervisor.phases import OpKind
from sglang_supervisor.store import Store
from tests.unit.engine.common import (
    S,
    nothing_held,
    ops_of,
    state_of,
)
from tests.unit.fakes import (
    Behaviour,
    make_rig,
    run,
    until,
)

# ---------------------------------------------------------------- shutdown


def test_shutdown_stops_releases_and_is_idempotent(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        await rig.sup.shutdown()
        assert state_of(rig) == S.STOPPED
        assert nothing_held(rig)
        assert rig.procs.alive_pids() == set()
        (op,) = ops_of(rig, OpKind.SHUTDOWN)
        assert op.state == SUCCEEDED
        assert rig.probe.closed
        assert rig.health.closed
        teardowns = len(rig.procs.teardowns)
        await rig.sup.shutdown()
        assert state_of(rig) == S.STOPPED
        assert len(rig.procs.teardowns) == teardowns
        with pytest.raises(Busy):
            await rig.sup.submit_start()
        assert Store(tmp_path).load().server is None

    run(main)


def test_shutdown_during_an_apply_cancels_it_and_frees_the_gpus(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(hold_ready=True))
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        await until(lambda: len(rig.procs.spawns) == 2)
        await rig.sup.shutdown()
        assert op.state == FAILED
        assert state_of(rig) == S.STOPPED
        assert nothing_held(rig)
        assert rig.procs.alive_pids() == set()

    run(main)


def test_shutdown_with_a_stuck_rank_ends_failed_naming_it(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.procs.plan(Behaviour(unkillable=True))

    async def main() -> None:
        await rig.start_ready()
        stuck = rig.procs.handles[0]
        await rig.sup.shutdown()
        assert state_of(rig) == S.FAILED
        (op,) = ops_of(rig, OpKind.SHUTDOWN)
        assert op.state == FAILED
        assert f"pid {stuck.rank_pids[0]}" in (op.error or "")

    run(main)
