"""Requests refused before anything is touched: busy, invalid, preflight.

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
from sglang_supervisor.operations import SUCCEEDED
from sglang_supervisor.sglang.levers import LeverError
from tests.unit.engine.common import (
    S,
    apply,
    settle,
    state_of,
)
from tests.unit.fakes import (
    GIB,
    INITIAL_LEVERS,
    Behaviour,
    make_rig,
    run,
    until,
)

# ------------------------------------------------------------- refusals


def test_a_second_operation_while_one_runs_is_busy(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(hold_ready=True))
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        await until(lambda: len(rig.procs.spawns) == 2)
        with pytest.raises(Busy) as info:
            await rig.sup.submit_apply({"mem_fraction_static": 0.7}, {})
        assert op.id in str(info.value)
        with pytest.raises(Busy):
            rig.sup.submit_stop()
        for submit in (rig.sup.submit_start, rig.sup.submit_restart):
            with pytest.raises(Busy):
                await submit()
        rig.procs.handles[1].held = False
        await settle(rig, op)
        assert op.state == SUCCEEDED
        assert len(rig.procs.spawns) == 2  # the refused requests started nothing
        assert (await rig.sup.status())["levers"]["mem_fraction_static"] == 0.9
        await rig.sup.shutdown()

    run(main)


def test_an_invalid_lever_touches_nothing(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        pid = rig.procs.handles[0].pid
        with pytest.raises(LeverError) as info:
            await rig.sup.submit_apply({"mem_fraction": 0.9, "kv_cache_dtype": "fp9"}, {})
        assert [p.lever for p in info.value.problems] == ["mem_fraction", "kv_cache_dtype"]
        assert len(rig.procs.spawns) == 1
        assert rig.procs.teardowns == []
        status = await rig.sup.status()
        assert status["state"] == "ready"
        assert status["server"]["pid"] == pid
        assert status["levers"] == INITIAL_LEVERS
        assert status["operation"] is None
        await rig.sup.shutdown()

    run(main)


def test_dry_run_checks_and_touches_nothing(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {}, dry_run=True)
        assert op.finished
        assert op.dry_run
        assert op.state == SUCCEEDED
        assert [p.name for p in op.phases] == ["validate", "preflight"]
        assert "would change mem_fraction_static" in op.phases[-1].detail
        assert len(rig.procs.spawns) == 1
        assert rig.procs.teardowns == []
        assert (await rig.sup.status())["levers"] == INITIAL_LEVERS
        with pytest.raises(LeverError):
            await rig.sup.submit_apply({"tp_size": 4}, {}, dry_run=True)
        await rig.sup.shutdown()

    run(main)


def test_preflight_refuses_more_tp_ranks_than_managed_gpus(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        with pytest.raises(LeverError) as info:
            await rig.sup.submit_apply({"tp_size": 4}, {})
        (problem,) = info.value.problems
        assert problem.lever == "tp_size"
        assert "needs 4 GPUs" in problem.message
        assert "manages 2" in problem.message
        assert len(rig.procs.spawns) == 1
        assert state_of(rig) == S.READY
        await rig.sup.shutdown()

    run(main)


def test_preflight_refuses_a_foreign_process_on_a_managed_gpu(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.probe.hold(99_999, 1, 2 * GIB)  # someone else's job lands on GPU 1
        with pytest.raises(LeverError) as info:
            await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        (problem,) = info.value.problems
        assert problem.lever == "gpus"
        assert "pid 99999 holds 2.0 GiB on GPU 1" in problem.message
        assert "never killed automatically" in problem.message
        assert 99_999 in rig.probe.holders  # not killed
        assert rig.procs.teardowns == []
        assert state_of(rig) == S.READY
        rig.probe.free(99_999)
        await rig.sup.shutdown()

    run(main)


def test_apply_with_an_alias_name_changes_the_canonical_lever(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        op = await apply(rig, {"tensor_parallel_size": 1})
        assert op.state == SUCCEEDED
        assert (await rig.sup.status())["levers"]["tp_size"] == 1
        await rig.sup.shutdown()

    run(main)
