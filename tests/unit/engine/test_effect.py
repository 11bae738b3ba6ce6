"""An apply's measured effect through the facade, on the fakes: the load history is fed
by the test (one sample every 20 ms, the figures changing once the new server runs), the
effect window is 0.4 s. With the guard a worse effect rolls the apply back; without it
the effect is measured after the commit, interrupted by another operation or the
daemon's exit, and appended to the history file once more when it is judged."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor.engine import effect
from sglang_supervisor.observe.telemetry import Throughput
from sglang_supervisor.operations import Operation
from sglang_supervisor.phases import OpKind
from sglang_supervisor.sglang.levers import LeverError
from sglang_supervisor.store import HISTORY_FILE
from tests.unit.engine.common import S, settle
from tests.unit.fakes import Rig, make_rig, run, until

WINDOW_S = 0.25


@contextlib.asynccontextmanager
async def fed(rig: Rig, before: float, after: float) -> AsyncIterator[None]:
    """Samples of ``before`` tokens/s while the first server serves, ``after`` once a
    later one does; 5 requests a second arrive throughout (comparable load)."""
    rig.health.metrics = None  # the daemon's own telemetry reads add nothing
    first = rig.procs.handles[0]
    done = 0.0

    async def feed() -> None:
        nonlocal done
        while True:
            done += 5 * 0.02
            tput = before if rig.procs.current() is first else after
            rig.sup.parts.history.record(
                Throughput(
                    gen_tokens_per_s=tput,
                    running_requests=0.5,  # a request spends 0.1 s in the server
                    queued_requests=0.0,
                    token_usage=0.5,
                    requests_total=done,
                    source="metrics",
                )
            )
            await asyncio.sleep(0.02)

    task = asyncio.create_task(feed())
    await asyncio.sleep(WINDOW_S)  # a window of history before the apply
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def history_lines(tmp_path: Path, op: Operation) -> list[dict[str, Any]]:
    lines = [json.loads(ln) for ln in (tmp_path / HISTORY_FILE).read_text().splitlines()]
    return [ln for ln in lines if ln["id"] == op.id]


def test_a_guarded_apply_that_does_worse_rolls_back_with_the_figures(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, effect_window_s=WINDOW_S)

    async def main() -> None:
        await rig.start_ready()
        async with fed(rig, before=1000.0, after=400.0):
            op = await rig.sup.submit_apply({"mem_fraction_static": 0.7}, {}, effect_guard=True)
            await settle(rig, op)
        assert op.state == "rolled_back", op.error
        names = [p.name for p in op.phases]
        assert names[names.index("probation") :][:3] == ["probation", "effect", "rollback_stop"]
        assert "throughput 1,000 → 400 tok/s (-60%)" in (op.rollback_reason or "")
        assert "effect_guard" in (op.rollback_reason or "")
        assert op.effect is not None and op.effect["verdict"] == "worse" and op.effect["guard"]
        assert op.effect["before"]["generation_throughput_tps"] == 1000.0
        assert op.effect["after"]["generation_throughput_tps"] == 400.0
        # The last-good levers serve again, from a third launch.
        assert rig.sup.state == S.READY and rig.sup.levers.levers["mem_fraction_static"] == 0.8
        assert len(rig.procs.handles) == 3 and rig.procs.current() is rig.procs.handles[2]
        assert rig.sup.view().effect_counts == {"worse": 1}

    run(main)


def test_a_guarded_apply_no_worse_commits_after_its_window(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, effect_window_s=WINDOW_S)

    async def main() -> None:
        await rig.start_ready()
        async with fed(rig, before=1000.0, after=1050.0):
            op = await rig.sup.submit_apply({"mem_fraction_static": 0.7}, {}, effect_guard=True)
            await settle(rig, op)
        assert op.state == "succeeded", op.error
        assert [p.name for p in op.phases][-3:] == ["probation", "effect", "commit"]
        effect_phase = next(p for p in op.phases if p.name == "effect")
        assert (effect_phase.duration_s or 0) >= WINDOW_S
        assert effect_phase.detail.startswith("unchanged: no figure moved")
        assert rig.sup.levers.levers["mem_fraction_static"] == 0.7
        assert len(rig.procs.handles) == 2

    run(main)


def test_the_guard_asked_for_without_a_window_is_refused(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, effect_window_s=0)

    async def main() -> None:
        await rig.start_ready()
        with pytest.raises(LeverError) as refused:
            await rig.sup.submit_apply({"mem_fraction_static": 0.7}, {}, effect_guard=True)
        assert refused.value.problems[0].lever == "effect_guard"
        assert "effect_window_s is 0" in refused.value.problems[0].message
        assert len(rig.procs.handles) == 1 and rig.sup.levers.levers["mem_fraction_static"] == 0.8

    run(main)


def test_a_crash_in_the_guarded_window_rolls_back(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, effect_window_s=2.0)

    async def main() -> None:
        await rig.start_ready()
        async with fed(rig, before=1000.0, after=1000.0):
            op = await rig.sup.submit_apply({"mem_fraction_static": 0.7}, {}, effect_guard=True)
            await until(lambda: any(p.name == "effect" for p in op.phases), 5, "the effect phase")
            rig.procs.crash(rig.procs.handles[1])
            await settle(rig, op)
        assert op.state == "rolled_back"
        assert "during its effect window" in (op.rollback_reason or "")
        assert op.effect is not None and op.effect["verdict"] == "interrupted"
        assert rig.sup.levers.levers["mem_fraction_static"] == 0.8 and rig.sup.state == S.READY

    run(main)


def test_without_the_guard_the_effect_is_measured_after_the_commit(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, effect_window_s=WINDOW_S)

    async def main() -> None:
        await rig.start_ready()
        async with fed(rig, before=1000.0, after=1600.0):
            op = await rig.sup.submit_apply({"mem_fraction_static": 0.7}, {})
            await settle(rig, op)
            # Committed at once; the effect is being measured.
            assert op.state == "succeeded" and "effect" not in [p.name for p in op.phases]
            assert op.effect is not None and op.effect["verdict"] == "measuring"
            assert op.effect["after"] is None and op.effect["before"]["samples"] >= 2
            assert rig.sup.view().effect == {"operation": op.id, **op.effect}
            await asyncio.sleep(0.1 + WINDOW_S + 0.05)  # it fills, then its window
            assert effect.look(rig.sup.parts, None) is op  # the watcher's telemetry read
        assert op.effect["verdict"] == "better", op.effect["detail"]
        assert "throughput 1,000 → 1,600 tok/s (+60%)" in op.effect["detail"]
        await until(lambda: len(history_lines(tmp_path, op)) == 2, 3, "the judged record")
        first, judged = history_lines(tmp_path, op)
        assert first["effect"]["verdict"] == "measuring"
        assert judged["effect"]["verdict"] == "better"
        events = rig.sup.events.recent()
        assert any(e["kind"] == "effect" and e["verdict"] == "better" for e in events)

    run(main)


def test_another_operation_or_the_daemons_exit_interrupts_the_measurement(
    tmp_path: Path,
) -> None:
    rig = make_rig(tmp_path, effect_window_s=30.0)

    async def main() -> None:
        await rig.start_ready()
        async with fed(rig, before=1000.0, after=1000.0):
            op = await settle(rig, await rig.sup.submit_apply({"mem_fraction_static": 0.7}, {}))
            restart = await settle(rig, await rig.sup.submit_restart())
        assert restart.kind == OpKind.RESTART
        assert op.effect is not None and op.effect["verdict"] == "interrupted"
        assert f"operation {restart.id} (restart) began" in op.effect["detail"]
        # The next apply's effect is cut by the daemon's exit.
        async with fed(rig, before=1000.0, after=1000.0):
            second = await settle(rig, await rig.sup.submit_apply({"mem_fraction_static": 0.6}, {}))
        assert second.effect is not None and second.effect["verdict"] == "measuring"
        await rig.sup.shutdown()
        assert second.effect["verdict"] == "interrupted"
        assert second.effect["detail"].startswith("the daemon stopped")
        assert history_lines(tmp_path, second)[-1]["effect"]["verdict"] == "interrupted"

    run(main)
