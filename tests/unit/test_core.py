"""The Supervisor driven through fakes: every lifecycle edge as the operator sees it.

Each test runs one scenario on a fresh event loop against a fake host (``tests.unit.fakes``):
GPUs whose memory is held by the ranks of fake launches, a process table the Supervisor
tears down, and health probes that follow the serving launch. Assertions are about what
an operator would notice: which levers serve, whether the GPUs are free, what the
operation and the error say.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from supervisor.core import Busy
from supervisor.levers import LeverError, LeverSet
from supervisor.operations import FAILED, ROLLED_BACK, RUNNING, SUCCEEDED, Operation
from supervisor.states import ServerState
from supervisor.store import PersistedState, Store
from tests.unit.fakes import (
    GIB,
    INITIAL_LEVERS,
    Behaviour,
    FakeProbe,
    FakeProcessOps,
    Rig,
    make_rig,
    make_settings,
    run,
    until,
)

S = ServerState
HELD_PER_RANK = int(0.8 * 80 * GIB)  # mem_fraction_static 0.8 of an 80 GiB fake GPU

APPLY_EDGES = [
    ("ready", "stopping"),
    ("stopping", "releasing"),
    ("releasing", "stopped"),
    ("stopped", "starting"),
    ("starting", "ready"),
]


def ops_of(rig: Rig, kind: str) -> list[Operation]:
    return [op for op in rig.sup.operations.values() if op.kind == kind]


async def settle(rig: Rig, op: Operation, timeout: float = 5.0) -> Operation:
    """Wait until ``op`` has finished and the Supervisor has cleared it."""
    await asyncio.wait_for(op.done.wait(), timeout)
    await until(lambda: rig.sup.operation is not op, timeout, f"operation {op.id} to clear")
    return op


async def apply(
    rig: Rig,
    levers: dict[str, object],
    *,
    env: dict[str, str] | None = None,
    drain_timeout_s: float = 0.0,
) -> Operation:
    """Submit an apply and wait for its outcome."""
    op = await rig.sup.submit_apply(levers, env or {}, drain_timeout_s=drain_timeout_s)
    return await settle(rig, op)


def phase_detail(op: Operation, name: str) -> str:
    return next(p.detail for p in op.phases if p.name == name)


def launched(rig: Rig, n: int) -> bool:
    """The Supervisor has recorded (persisted, then announced) its ``n``-th launch."""
    pids = [e["pid"] for e in rig.sup.events.recent() if e["kind"] == "launch"]
    return len(rig.procs.spawns) >= n and rig.procs.handles[n - 1].pid in pids


def state_of(rig: Rig) -> ServerState:
    return rig.sup.state


def idle(rig: Rig, state: ServerState) -> bool:
    """In ``state`` with no operation running (the last one has finished and been cleared)."""
    return rig.sup.state == state and rig.sup.operation is None


def nothing_held(rig: Rig) -> bool:
    return all(v == 0 for v in rig.probe.above_baseline().values())


# ------------------------------------------------------------------ start


def test_transition_stopped_to_starting_to_ready_at_start(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        assert rig.transitions() == [("stopped", "starting"), ("starting", "ready")]
        status = await rig.sup.status()
        assert status["state"] == "ready"
        assert status["backend"] == "simulated"
        assert status["server"]["pid"] == rig.procs.handles[0].pid
        assert status["server"]["max_total_num_tokens"] == 400_000
        assert status["levers"] == INITIAL_LEVERS
        assert status["last_good_levers"] == {"levers": INITIAL_LEVERS, "env": {}}
        # One rank per GPU, each holding its share, reported as ours.
        assert rig.probe.above_baseline() == {0: HELD_PER_RANK, 1: HELD_PER_RANK}
        for gpu in status["gpus"]:
            assert [p["member"] for p in gpu["processes"]] == [True]
        await rig.sup.shutdown()

    run(main)


def test_start_with_an_unknown_gpu_names_it_and_spawns_nothing(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, gpus=["0", "7"])

    async def main() -> None:
        with pytest.raises(ValueError, match="managed GPU '7' does not exist"):
            await rig.sup.start()
        assert rig.procs.spawns == []
        assert state_of(rig) == S.STOPPED

    run(main)


def test_start_with_invalid_configured_levers_names_the_lever(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, levers={"model_path": "m", "mem_fraction": 0.9})

    async def main() -> None:
        with pytest.raises(ValueError, match="initial levers are invalid: mem_fraction"):
            await rig.sup.start()
        assert rig.procs.spawns == []

    run(main)


def test_spawn_env_names_gpus_by_uuid_and_tags_each_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = FakeProbe(count=3)
    # Managed GPUs named one by UUID and one by index, in that order; GPU 2 is not ours.
    rig = make_rig(tmp_path, probe=probe, gpus=[probe.gpus[1].uuid, "0"])
    # A daemon's own tag in its environment must never leak into a server's.
    monkeypatch.setenv("SGLANG_SUPERVISOR_INSTANCE", "stale.tag")

    async def main() -> None:
        await rig.start_ready()
        await apply(rig, {"mem_fraction_static": 0.85}, env={"NCCL_DEBUG": "INFO"})
        await settle(rig, rig.sup.submit_restart())
        first, second, third = rig.procs.spawns
        uuids = f"{probe.gpus[1].uuid},{probe.gpus[0].uuid}"
        for record in rig.procs.spawns:
            assert record.env["CUDA_VISIBLE_DEVICES"] == uuids
            assert record.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
            assert "SGLANG_SUPERVISOR_INSTANCE" not in record.env
            assert record.tag.startswith("unit-test.")
            assert record.argv[-5:] == [
                "--host",
                "127.0.0.1",
                "--port",
                str(rig.settings.server.port),
                "--enable-metrics",
            ]
        assert len({r.tag for r in rig.procs.spawns}) == 3
        assert "NCCL_DEBUG" not in first.env
        assert second.env["NCCL_DEBUG"] == "INFO"
        assert third.argv == second.argv
        # Rank 0 sits on the first managed GPU (index 1); the unmanaged GPU stays empty.
        assert rig.probe.above_baseline()[2] == 0
        assert rig.probe.above_baseline()[1] == int(0.85 * 80 * GIB)
        await rig.sup.shutdown()

    run(main)


def test_pids_from_another_namespace_are_reported_and_release_uses_memory(
    tmp_path: Path,
) -> None:
    rig = make_rig(tmp_path, probe=FakeProbe(local=False))

    async def main() -> None:
        await rig.start_ready()
        status = await rig.sup.status()
        assert status["gpu_probe"]["pids_are_local"] is False
        assert any("PID namespace" in w for w in status["warnings"])
        op = await apply(rig, {"mem_fraction_static": 0.7})
        assert op.state == SUCCEEDED
        assert rig.probe.above_baseline() == {0: int(0.7 * 80 * GIB), 1: int(0.7 * 80 * GIB)}
        await rig.sup.shutdown()
        assert nothing_held(rig)

    run(main)


def test_a_gpu_query_failure_at_start_launches_nothing(tmp_path: Path) -> None:
    """GPUs in an unknown state are never "empty": no launch, and the error says why."""
    rig = make_rig(tmp_path)
    rig.probe.fail(1, "NVML: GPU is lost")

    async def main() -> None:
        await rig.sup.start()
        op = rig.sup.operation
        assert op is not None
        await settle(rig, op)
        assert op.state == FAILED
        assert "cannot read the managed GPUs: NVML: GPU is lost" in (op.error or "")
        assert rig.procs.spawns == []
        await rig.sup.shutdown()

    run(main)


def test_real_backend_without_sglang_refuses_applies_naming_server_python(
    tmp_path: Path,
) -> None:
    missing = str(tmp_path / "no-such-python")
    rig = make_rig(tmp_path / "state", backend_name="sglang", python=missing)

    async def main() -> None:
        await rig.start_ready()
        assert any("does not exist" in w for w in (await rig.sup.status())["warnings"])
        with pytest.raises(LeverError) as info:
            await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        (problem,) = info.value.problems
        assert problem.lever == "server.python"
        assert missing in problem.message
        assert "does not exist" in problem.message
        assert len(rig.procs.spawns) == 1
        await rig.sup.shutdown()

    run(main)


def test_real_backend_without_sglang_names_the_real_cause_in_a_container(
    tmp_path: Path,
) -> None:
    missing = str(tmp_path / "no-such-python")
    rig = make_rig(
        tmp_path / "state", probe=FakeProbe(local=False), backend_name="sglang", python=missing
    )

    async def main() -> None:
        await rig.start_ready()
        with pytest.raises(LeverError) as info:
            await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        (problem,) = info.value.problems
        assert "does not exist" in problem.message
        assert "PID namespace" not in problem.message

    run(main)


def test_a_foreign_process_on_a_managed_gpu_blocks_the_initial_launch(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.probe.hold(99_999, 0, 10 * GIB)  # another user's job on GPU 0

    async def main() -> None:
        await rig.sup.start()
        op = rig.sup.operation
        assert op is not None
        await settle(rig, op)
        assert rig.procs.spawns == []
        assert op.state == FAILED
        assert "pid 99999 holds 10.0 GiB on GPU 0" in (op.error or "")
        assert 99_999 in rig.probe.holders  # never killed
        # Once the GPU is free, an operator's start launches.
        rig.probe.free(99_999)
        start = await settle(rig, rig.sup.submit_start())
        assert start.state == SUCCEEDED
        assert state_of(rig) == S.READY
        await rig.sup.shutdown()

    run(main)


def test_the_foreign_process_warning_goes_once_the_server_serves(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)
    rig.probe.hold(99_999, 0, 10 * GIB)

    async def main() -> None:
        await rig.sup.start()
        op = rig.sup.operation
        assert op is not None
        await settle(rig, op)
        rig.probe.free(99_999)
        await settle(rig, rig.sup.submit_start())
        status = await rig.sup.status()
        assert status["state"] == "ready"
        assert not any("99999" in w for w in status["warnings"])

    run(main)


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
        assert rig.transitions() == [("stopped", "starting"), ("starting", "ready"), *APPLY_EDGES]
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
        assert phase_detail(op, "drain") == "no running or queued requests"
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
        assert "with 3.0 requests left" in phase_detail(op, "drain")
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


# ----------------------------------------------------------------- crashes


def test_crash_while_ready_backs_off_and_restarts_the_same_levers(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        first = rig.procs.handles[0]
        # The launcher dies alone: its ranks are orphaned and keep their memory.
        rig.procs.crash(first, returncode=-9, orphan_ranks=True)
        await until(lambda: rig.sup.restarts == 1 and idle(rig, S.READY))
        assert rig.sup.restarts_by_reason == {"crash": 1}
        assert rig.transitions()[2:] == [
            ("ready", "stopping"),
            ("stopping", "releasing"),
            ("releasing", "backoff"),
            ("backoff", "starting"),
            ("starting", "ready"),
        ]
        (recover,) = ops_of(rig, "recover")
        assert recover.state == SUCCEEDED
        assert "killed by SIGKILL" in (recover.rollback_reason or "")
        # The orphaned ranks were killed and their memory freed before the relaunch.
        assert not (rig.procs.alive_pids() & set(first.rank_pids))
        assert rig.procs.spawns[1].gpu_held_at_spawn == {0: 0, 1: 0}
        assert rig.procs.spawns[1].argv == rig.procs.spawns[0].argv
        assert (await rig.sup.status())["levers"] == INITIAL_LEVERS
        await rig.sup.shutdown()

    run(main)


def test_transition_backoff_to_failed_on_a_crash_loop(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(exit_on_start=1), Behaviour(exit_on_start=1))
        rig.procs.crash(rig.procs.handles[0])
        await until(lambda: idle(rig, S.FAILED))
        assert rig.sup.state_reason.startswith("crash loop: 3 failures")
        assert "POST /start" in rig.sup.state_reason
        (recover,) = ops_of(rig, "recover")
        assert recover.state == FAILED
        assert "crash loop" in (recover.error or "")
        assert rig.transitions()[-1] == ("backoff", "failed")
        assert rig.sup.restarts == 0
        assert nothing_held(rig)
        # An operator's start brings it back.
        start = await settle(rig, rig.sup.submit_start())
        assert start.state == SUCCEEDED
        assert state_of(rig) == S.READY
        await rig.sup.shutdown()

    run(main)


def test_a_crash_after_an_operator_start_from_failed_is_restarted(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(exit_on_start=1), Behaviour(exit_on_start=1))
        rig.procs.crash(rig.procs.handles[0])
        await until(lambda: idle(rig, S.FAILED))
        await settle(rig, rig.sup.submit_start())
        assert state_of(rig) == S.READY
        # The operator fixed the cause; much later, one unrelated crash.
        rig.procs.crash(rig.procs.handles[-1])
        await until(lambda: len(ops_of(rig, "recover")) == 2 and ops_of(rig, "recover")[1].finished)
        assert state_of(rig) == S.READY
        assert rig.sup.restarts == 1

    run(main)


def test_hung_server_is_restarted_after_failed_liveness_probes(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        hung = rig.procs.handles[0]
        hung.hung = True
        await until(lambda: rig.sup.restarts == 1 and idle(rig, S.READY))
        assert rig.sup.restarts_by_reason == {"hung": 1}
        (recover,) = ops_of(rig, "recover")
        assert "2 consecutive liveness probes failed" in (recover.rollback_reason or "")
        # The hung tree was torn down (it had not exited on its own).
        assert not (rig.procs.alive_pids() & {hung.pid, *hung.rank_pids})
        assert rig.procs.current() is rig.procs.handles[1]
        await rig.sup.shutdown()

    run(main)


def test_transition_backoff_to_stopping_when_an_apply_preempts_the_restart(
    tmp_path: Path,
) -> None:
    rig = make_rig(tmp_path, backoff_initial_s=5.0, backoff_max_s=5.0)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.crash(rig.procs.handles[0])
        await until(lambda: rig.sup.state == S.BACKOFF)
        op = await apply(rig, {"mem_fraction_static": 0.7})
        assert op.state == SUCCEEDED
        assert ("backoff", "stopping") in rig.transitions()
        (recover,) = ops_of(rig, "recover")
        assert recover.state == FAILED
        assert "superseded" in (recover.error or "")
        assert (await rig.sup.status())["levers"]["mem_fraction_static"] == 0.7
        await rig.sup.shutdown()

    run(main)


def test_an_invalid_apply_during_backoff_does_not_cancel_the_restart(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, backoff_initial_s=0.2, backoff_max_s=0.2)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.crash(rig.procs.handles[0])
        await until(lambda: rig.sup.state == S.BACKOFF)
        with pytest.raises(LeverError):
            await rig.sup.submit_apply({"mem_fraction": 0.9}, {})
        (recover,) = ops_of(rig, "recover")
        assert recover.state == RUNNING, recover.error
        await until(lambda: idle(rig, S.READY), timeout=2.0)

    run(main)


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
        for submit in (rig.sup.submit_stop, rig.sup.submit_start, rig.sup.submit_restart):
            with pytest.raises(Busy):
                submit()
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
        assert "GPU 1 is used by pid 99999" in problem.message
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
        start = await settle(rig, rig.sup.submit_start())
        assert start.state == SUCCEEDED
        assert state_of(rig) == S.READY
        assert rig.procs.spawns[1].argv == rig.procs.spawns[0].argv
        again = await settle(rig, rig.sup.submit_start())
        assert phase_detail(again, "start") == "already ready; nothing to do"
        assert len(rig.procs.spawns) == 2
        await rig.sup.shutdown()

    run(main)


# ---------------------------------------------------------------- shutdown


def test_shutdown_stops_releases_and_is_idempotent(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        await rig.sup.shutdown()
        assert state_of(rig) == S.STOPPED
        assert nothing_held(rig)
        assert rig.procs.alive_pids() == set()
        (op,) = ops_of(rig, "shutdown")
        assert op.state == SUCCEEDED
        assert rig.probe.closed
        assert rig.health.closed
        teardowns = len(rig.procs.teardowns)
        await rig.sup.shutdown()
        assert state_of(rig) == S.STOPPED
        assert len(rig.procs.teardowns) == teardowns
        with pytest.raises(Busy):
            rig.sup.submit_start()
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
        (op,) = ops_of(rig, "shutdown")
        assert op.state == FAILED
        assert f"pid {stuck.rank_pids[0]}" in (op.error or "")

    run(main)


# ---------------------------------------------------------- daemon restarts


def test_a_restarted_daemon_starts_the_last_good_levers(tmp_path: Path) -> None:
    first = make_rig(tmp_path)

    async def before() -> None:
        await first.start_ready()
        op = await apply(first, {"mem_fraction_static": 0.9}, env={"NCCL_DEBUG": "INFO"})
        assert op.state == SUCCEEDED
        await first.sup.shutdown()

    run(before)
    second = make_rig(tmp_path, settings=make_settings(tmp_path))

    async def after() -> None:
        await second.start_ready()
        (spawn,) = second.procs.spawns
        assert spawn.argv[spawn.argv.index("--mem-fraction-static") + 1] == "0.9"
        assert spawn.env["NCCL_DEBUG"] == "INFO"
        status = await second.sup.status()
        assert status["levers"]["mem_fraction_static"] == 0.9
        assert status["last_good_levers"]["levers"]["mem_fraction_static"] == 0.9
        await second.sup.shutdown()

    run(after)


def killed_mid_apply(tmp_path: Path) -> tuple[FakeProcessOps, Rig]:
    """A daemon that applied mem_fraction_static 0.9 and died (no shutdown) while the new
    server was still loading; returns the shared fake host and that daemon's rig."""
    procs = FakeProcessOps(FakeProbe())
    first = make_rig(tmp_path, procs=procs)

    async def before() -> None:
        await first.start_ready()
        procs.plan(Behaviour(hold_ready=True))
        await first.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        await until(lambda: launched(first, 2), what="the new launch to be recorded")
        # The loop ends here without shutdown(): the daemon was SIGKILLed.

    run(before)
    return procs, first


def test_a_daemon_killed_mid_apply_restarts_with_last_good_after_clearing_leftovers(
    tmp_path: Path,
) -> None:
    """The old daemon died while its new levers were loading: their launch is a leftover."""
    procs, first = killed_mid_apply(tmp_path)
    leftover = procs.handles[1]
    assert procs.alive_pids() == {leftover.pid, *leftover.rank_pids}
    second = make_rig(tmp_path, procs=procs, settings=first.settings)

    async def after() -> None:
        await second.start_ready()
        assert second.transitions() == [
            ("stopped", "stopping"),
            ("stopping", "releasing"),
            ("releasing", "stopped"),
            ("stopped", "starting"),
            ("starting", "ready"),
        ]
        assert not (procs.alive_pids() & {leftover.pid, *leftover.rank_pids})
        relaunch = procs.spawns[2]
        assert relaunch.gpu_held_at_spawn == {0: 0, 1: 0}
        assert relaunch.argv == procs.spawns[0].argv  # last-good 0.8, not the pending 0.9
        assert (await second.sup.status())["levers"] == INITIAL_LEVERS
        await second.sup.shutdown()
        assert nothing_held(second)

    run(after)


def test_a_restarted_daemon_adopts_its_healthy_server(tmp_path: Path) -> None:
    procs = FakeProcessOps(FakeProbe())
    first = make_rig(tmp_path, procs=procs)

    async def before() -> None:
        await first.start_ready()  # then the daemon dies; the server keeps serving

    run(before)
    serving = procs.handles[0]
    second = make_rig(tmp_path, procs=procs, settings=first.settings)

    async def after() -> None:
        await second.start_ready()
        assert len(procs.spawns) == 1  # no model reload
        assert procs.teardowns == []
        status = await second.sup.status()
        assert status["server"]["pid"] == serving.pid
        assert status["levers"] == INITIAL_LEVERS
        assert second.probe.above_baseline() == {0: HELD_PER_RANK, 1: HELD_PER_RANK}
        # Adopted for real: a crash of the adopted server is noticed and recovered.
        procs.crash(serving)
        await until(lambda: second.sup.restarts == 1 and idle(second, S.READY))
        await second.sup.shutdown()
        assert nothing_held(second)

    run(after)


def test_a_restarted_daemon_does_not_adopt_a_dead_server(tmp_path: Path) -> None:
    procs = FakeProcessOps(FakeProbe())
    first = make_rig(tmp_path, procs=procs)

    async def before() -> None:
        await first.start_ready()

    run(before)
    procs.crash(procs.handles[0])  # the server died while no daemon was watching
    second = make_rig(tmp_path, procs=procs, settings=first.settings)

    async def after() -> None:
        await second.start_ready()
        assert len(procs.spawns) == 2
        assert (await second.sup.status())["server"]["pid"] == procs.handles[1].pid
        await second.sup.shutdown()

    run(after)


def test_a_restarted_daemon_adopts_an_interrupted_apply_that_became_ready(
    tmp_path: Path,
) -> None:
    procs, first = killed_mid_apply(tmp_path)
    procs.handles[1].held = False  # meanwhile the new server finished loading
    second = make_rig(tmp_path, procs=procs, settings=first.settings)

    async def after() -> None:
        await second.start_ready()
        assert len(procs.spawns) == 2
        status = await second.sup.status()
        assert status["server"]["pid"] == procs.handles[1].pid
        assert status["levers"]["mem_fraction_static"] == 0.9
        assert status["last_good_levers"]["levers"]["mem_fraction_static"] == 0.9
        persisted = Store(tmp_path).load()
        assert persisted.pending_operation is None
        await second.sup.shutdown()

    run(after)


def test_persisted_levers_that_no_longer_fit_sglang_fall_back_to_the_configured(
    tmp_path: Path,
) -> None:
    # An SGLang upgrade renamed a flag the last-good set uses: never a KeyError at launch.
    stale = LeverSet({"model_path": "m", "tp_size": 4, "flag_removed_in_upgrade": 1})
    Store(tmp_path).save(PersistedState(levers=stale, last_good=stale))
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        status = await rig.sup.status()
        assert "flag_removed_in_upgrade" not in status["levers"]
        assert status["levers"] == dict(rig.settings.server.levers)
        assert any("do not fit SGLang" in w for w in status["warnings"])
        await rig.sup.shutdown()

    run(main)
