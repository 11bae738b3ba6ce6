"""The initial start: GPUs, levers, foreign processes, the live schema.

Each test runs one scenario on a fresh event loop against a fake host (``tests.unit.fakes``):
GPUs whose memory is held by the ranks of fake launches, a process table the Supervisor
tears down, and health probes that follow the serving launch. Assertions are about what
an operator would notice: which levers serve, whether the GPUs are free, what the
operation and the error say.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_supervisor.operations import FAILED, SUCCEEDED
from sglang_supervisor.sglang.levers import LeverError
from tests.unit.engine.common import (
    HELD_PER_RANK,
    S,
    apply,
    nothing_held,
    settle,
    state_of,
)
from tests.unit.fakes import (
    GIB,
    INITIAL_LEVERS,
    FakeProbe,
    make_rig,
    run,
)

# ------------------------------------------------------------------ start


def test_transition_stopped_to_starting_to_ready_at_start(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        assert rig.transitions() == [("loading", "starting"), ("starting", "ready")]
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
        assert state_of(rig) == S.LOADING  # start-up never got past loading: the daemon exits 2

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
        await settle(rig, await rig.sup.submit_restart())
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
        start = await settle(rig, await rig.sup.submit_start())
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
        await settle(rig, await rig.sup.submit_start())
        status = await rig.sup.status()
        assert status["state"] == "ready"
        assert not any("99999" in w for w in status["warnings"])

    run(main)
