"""Release verification: unkillable members, SIGTERM escalated to SIGKILL.

Each test runs one scenario on a fresh event loop against a fake host (``tests.unit.fakes``):
GPUs whose memory is held by the ranks of fake launches, a process table the Supervisor
tears down, and health probes that follow the serving launch. Assertions are about what
an operator would notice: which levers serve, whether the GPUs are free, what the
operation and the error say.
"""

from __future__ import annotations

from pathlib import Path

from sglang_supervisor.operations import FAILED, SUCCEEDED
from tests.unit.engine.common import (
    S,
    apply,
    nothing_held,
    phase_detail,
    settle,
    state_of,
)
from tests.unit.fakes import (
    Behaviour,
    make_rig,
    run,
)

# ---------------------------------------------------------------- release


def test_unkillable_member_fails_the_apply_and_names_the_pid(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.procs.plan(Behaviour(unkillable=True))

    async def main() -> None:
        await rig.start_ready()
        stuck = rig.procs.handles[0]
        op = await apply(rig, {"mem_fraction_static": 0.9})
        assert op.state == FAILED
        assert state_of(rig) == S.FAILED
        error = op.error or ""
        assert error.startswith("the old server could not be released")
        for pid in stuck.rank_pids:
            assert f"pid {pid}" in error
        assert "uninterruptible sleep" in error
        assert "MiB above baseline" in error
        # Nothing new was started on top of the held GPUs; status shows who holds them.
        assert len(rig.procs.spawns) == 1
        status = await rig.sup.status()
        assert status["state"] == "failed"
        holders = {p["pid"]: p["member"] for g in status["gpus"] for p in g["processes"]}
        assert holders == {pid: True for pid in stuck.rank_pids}
        # Once the driver lets go, an operator's stop brings it to stopped.
        rig.procs.release_stuck()
        stop = await settle(rig, rig.sup.submit_stop())
        assert stop.state == SUCCEEDED
        assert ("failed", "stopping") in rig.transitions()
        assert state_of(rig) == S.STOPPED
        assert nothing_held(rig)
        await rig.sup.shutdown()

    run(main)


def test_sigterm_ignored_is_escalated_to_sigkill(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.procs.plan(Behaviour(ignore_sigterm=True))

    async def main() -> None:
        await rig.start_ready()
        stubborn = rig.procs.handles[0]
        op = await apply(rig, {"mem_fraction_static": 0.9})
        assert op.state == SUCCEEDED
        assert f"SIGKILL to {sorted([stubborn.pid, *stubborn.rank_pids])}" in phase_detail(
            op, "stop"
        )
        assert stubborn.returncode == -9
        assert rig.procs.spawns[1].gpu_held_at_spawn == {0: 0, 1: 0}
        await rig.sup.shutdown()

    run(main)


def test_release_takes_the_configured_number_of_clean_samples(tmp_path: Path) -> None:
    """release_samples = 4: the GPUs are judged released only after four clean samples in
    a row, each one visible on GET /events as a release_sample."""
    rig = make_rig(tmp_path, release_samples=4)

    async def main() -> None:
        await rig.start_ready()
        op = await settle(rig, rig.sup.submit_stop())
        assert op.state == SUCCEEDED
        samples = [
            e
            for e in rig.sup.events.recent()
            if e["kind"] == "release_sample" and e["operation"] == op.id
        ]
        assert len(samples) == 4
        await rig.sup.shutdown()

    run(main)
