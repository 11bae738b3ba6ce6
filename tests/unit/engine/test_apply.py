"""The apply transaction: drain, stop, release, start, probation, commit, or roll back.

Each test runs one scenario on a fresh event loop against a fake host (``tests.unit.fakes``):
GPUs whose memory is held by the ranks of fake launches, a process table the Supervisor
tears down, and health probes that follow the serving launch. Assertions are about what
an operator would notice: which levers serve, whether the GPUs are free, what the
operation and the error say.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from sglang_supervisor.engine import checks
from sglang_supervisor.operations import FAILED, ROLLED_BACK, SUCCEEDED
from sglang_supervisor.phases import PhaseName
from sglang_supervisor.store import Store
from tests.unit.engine.common import (
    APPLY_EDGES,
    HELD_PER_RANK,
    S,
    apply,
    nothing_held,
    phase_detail,
    settle,
    state_of,
)
from tests.unit.fakes import (
    GIB,
    INITIAL_LEVERS,
    Behaviour,
    make_rig,
    run,
)

# ------------------------------------------------------------------ apply


def test_apply_success_serves_and_persists_the_new_levers(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    new = {"mem_fraction_static": 0.9, "kv_cache_dtype": "fp8_e4m3"}

    async def main() -> None:
        await rig.start_ready()
        old = rig.procs.handles[0]
        op = await apply(rig, new, env={"NCCL_DEBUG": "INFO"})
        assert op.state == SUCCEEDED, op.error
        assert [p.name for p in op.phases] == [
            "validate",
            "preflight",
            "stop",
            "release",
            "start",
            "probation",
            "commit",
        ]
        expected = {**INITIAL_LEVERS, **new}
        status = await rig.sup.status()
        assert status["server"]["pid"] == rig.procs.handles[1].pid != old.pid
        assert status["levers"] == expected
        assert status["env"] == {"NCCL_DEBUG": "INFO"}
        assert status["last_good_levers"] == {"levers": expected, "env": {"NCCL_DEBUG": "INFO"}}
        assert op.levers_effective == status["last_good_levers"]
        # The old tree is gone and the new one was started on empty GPUs.
        assert not (rig.procs.alive_pids() & {old.pid, *old.rank_pids})
        assert rig.procs.spawns[1].gpu_held_at_spawn == {0: 0, 1: 0}
        argv = rig.procs.spawns[1].argv
        assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
        assert rig.probe.above_baseline() == {0: int(0.9 * 80 * GIB), 1: int(0.9 * 80 * GIB)}
        # Persisted: what a restarted daemon would read.
        persisted = Store(tmp_path).load()
        assert persisted.last_good is not None
        assert dict(persisted.last_good.levers) == expected
        assert dict(persisted.last_good.env) == {"NCCL_DEBUG": "INFO"}
        assert persisted.pending_operation is None
        await rig.sup.shutdown()

    run(main)


def test_apply_events_show_every_transition_in_order(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        await apply(rig, {"mem_fraction_static": 0.9})
        assert rig.transitions() == [("loading", "starting"), ("starting", "ready"), *APPLY_EDGES]
        seqs = [e["seq"] for e in rig.sup.events.recent()]
        assert seqs == sorted(seqs)
        phases = [
            (e["name"], e["state"])
            for e in rig.sup.events.recent()
            if e["kind"] == "phase" and e["op_kind"] == "apply"
        ]
        assert phases[-2:] == [("commit", "running"), ("commit", "succeeded")]
        await rig.sup.shutdown()

    run(main)


def test_transition_ready_to_draining_waits_for_requests(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        op = await apply(rig, {"mem_fraction_static": 0.9}, drain_timeout_s=5.0)
        assert op.state == SUCCEEDED
        assert ("ready", "draining") in rig.transitions()
        assert ("draining", "stopping") in rig.transitions()
        assert phase_detail(op, PhaseName.DRAIN) == "no running or queued requests"
        await rig.sup.shutdown()

    run(main)


def test_drain_is_bounded_when_requests_keep_running(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        assert rig.health.metrics is not None
        rig.health.metrics = rig.health.metrics.replace(
            'sglang:num_running_reqs{model_name="fake"} 0.0',
            'sglang:num_running_reqs{model_name="fake"} 3.0',
        )
        op = await apply(rig, {"mem_fraction_static": 0.9}, drain_timeout_s=0.1)
        assert op.state == SUCCEEDED
        assert "with 3 requests still running or queued" in phase_detail(op, PhaseName.DRAIN)
        await rig.sup.shutdown()

    run(main)


def test_transition_starting_to_stopping_when_the_new_start_exits_rolls_back(
    tmp_path: Path,
) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(exit_on_start=1, log_lines=["ValueError: bad model config"]))
        op = await apply(rig, {"mem_fraction_static": 0.9})
        bad, good = rig.procs.handles[1], rig.procs.handles[2]
        assert op.state == ROLLED_BACK
        assert op.error is not None
        assert f"pid {bad.pid}" in op.error
        assert "exited with code 1 during start" in op.error
        assert op.rollback_reason == op.error
        assert "ValueError: bad model config" in op.log_tail
        # The last-good levers serve again, from a fresh launch with the old argv.
        status = await rig.sup.status()
        assert status["state"] == "ready"
        assert status["levers"] == INITIAL_LEVERS
        assert status["server"]["pid"] == good.pid
        assert rig.procs.spawns[2].argv == rig.procs.spawns[0].argv
        assert op.levers_effective == {"levers": INITIAL_LEVERS, "env": {}}
        assert rig.probe.above_baseline() == {0: HELD_PER_RANK, 1: HELD_PER_RANK}
        # The failed levers were not persisted as good, and no apply is left pending.
        persisted = Store(tmp_path).load()
        assert persisted.last_good is not None
        assert dict(persisted.last_good.levers) == INITIAL_LEVERS
        assert persisted.levers is not None
        assert dict(persisted.levers.levers) == INITIAL_LEVERS
        assert persisted.pending_operation is None
        await rig.sup.shutdown()

    run(main)


def test_oom_at_start_rolls_back_and_says_lower_mem_fraction_static(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(
            Behaviour(
                exit_on_start=1,
                log_lines=["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"],
            )
        )
        op = await apply(rig, {"mem_fraction_static": 0.97})
        assert op.state == ROLLED_BACK
        assert "lower mem_fraction_static" in (op.error or "")
        assert (await rig.sup.status())["levers"]["mem_fraction_static"] == 0.8
        await rig.sup.shutdown()

    run(main)


def test_rejected_arguments_at_start_are_quoted(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        line = "launch_server.py: error: argument --kv-cache-dtype: invalid choice: 'fp9'"
        rig.procs.plan(Behaviour(exit_on_start=2, log_lines=[line]))
        op = await apply(rig, {"kv_cache_dtype": "fp8_e5m2"})
        assert op.state == ROLLED_BACK
        assert f"it rejected its arguments: {line}" in (op.error or "")
        await rig.sup.shutdown()

    run(main)


def test_never_ready_times_out_and_rolls_back(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(never_ready=True))
        op = await apply(rig, {"mem_fraction_static": 0.9})
        hung = rig.procs.handles[1]
        assert op.state == ROLLED_BACK
        assert "ready_timeout_s" in (op.error or "")
        assert f"pid {hung.pid} was still running" in (op.error or "")
        # The launch that never became ready was torn down, not left holding GPUs.
        assert not (rig.procs.alive_pids() & {hung.pid, *hung.rank_pids})
        assert (await rig.sup.status())["levers"] == INITIAL_LEVERS
        assert rig.probe.above_baseline() == {0: HELD_PER_RANK, 1: HELD_PER_RANK}
        await rig.sup.shutdown()

    run(main)


def test_crash_within_probation_rolls_back(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(crash_after_ready_s=0.0))
        op = await apply(rig, {"mem_fraction_static": 0.9})
        assert op.state == ROLLED_BACK
        assert "within the probation window" in (op.error or "")
        assert "SIGSEGV" in (op.error or "")
        # It had been ready: the transitions show ready -> stopping for the rollback.
        edges = rig.transitions()[2:]
        assert edges == APPLY_EDGES + APPLY_EDGES
        assert (await rig.sup.status())["levers"] == INITIAL_LEVERS
        await rig.sup.shutdown()

    run(main)


def test_spawn_error_rolls_back_and_names_the_program(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.spawn_error = OSError(
            errno.ENOENT, "cannot start the server 'fake-sglang': No such file or directory"
        )
        op = await apply(rig, {"mem_fraction_static": 0.9})
        assert op.state == ROLLED_BACK
        assert "cannot start the server 'fake-sglang'" in (op.error or "")
        assert state_of(rig) == S.READY
        await rig.sup.shutdown()

    run(main)


def test_transition_releasing_to_failed_when_the_rollback_also_fails(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(exit_on_start=1), Behaviour(exit_on_start=3))
        op = await apply(rig, {"mem_fraction_static": 0.9})
        assert op.state == FAILED
        assert "rolling back also failed" in (op.error or "")
        assert "exited with code 3" in (op.error or "")
        assert rig.transitions()[-1] == ("releasing", "failed")
        assert state_of(rig) == S.FAILED
        assert nothing_held(rig)
        await rig.sup.shutdown()
        assert state_of(rig) == S.STOPPED

    run(main)


def test_commit_that_cannot_persist_fails_the_operation_but_keeps_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = make_rig(tmp_path)

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    async def main() -> None:
        await rig.start_ready()
        # The disk fills after preflight found it writable (see test_after_the_stop for
        # a disk full before: refused, nothing stopped).
        monkeypatch.setattr(checks, "state_dir_problems", lambda *_: [])
        monkeypatch.setattr(os, "fsync", disk_full)
        op = await apply(rig, {"mem_fraction_static": 0.9})
        monkeypatch.undo()
        assert op.state == FAILED
        assert "the new levers serve, but persisting them failed" in (op.error or "")
        assert "No space left on device" in (op.error or "")
        status = await rig.sup.status()
        assert status["state"] == "ready"
        assert status["levers"]["mem_fraction_static"] == 0.9
        assert any("No space left on device" in w for w in status["warnings"])
        await rig.sup.shutdown()

    run(main)


def test_an_operation_is_counted_before_anyone_waiting_on_it_wakes(tmp_path: Path) -> None:
    """POST /levers?wait=true answers when the operation is done; a scrape right after
    must already count it (it did not, while the apply still cleared its journal)."""
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(exit_on_start=1))
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        await op.done.wait()
        view = rig.sup.view()  # no await between the wake-up and the look
        assert op.state == ROLLED_BACK
        assert view.operation_counts.get(("apply", "rolled_back")) == 1
        assert view.last_operation is not None and view.last_operation["id"] == op.id
        await settle(rig, op)
        await rig.sup.shutdown()

    run(main)
