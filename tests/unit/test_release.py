"""Release verification (``sglang_supervisor.host.gpu.wait_released``) on fake GPUs and a fake
clock.

A GPU is released when no member pid is on it and its memory is at most baseline +
tolerance, for ``consecutive`` samples in a row; a failed query is never "zero".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from pathlib import Path

import pytest

from sglang_supervisor.host.gpu import ReleaseResult, resolve_gpus, wait_released
from sglang_supervisor.states import ServerState
from tests.unit.fakes import GIB, MIB, FakeClock, FakeProbe, make_rig, run, until

BASE = 600 * MIB
TOLERANCE = 512 * MIB
RANK_PID = 52_001


def release(
    probe: FakeProbe,
    clock: FakeClock,
    members: Callable[[], Collection[int]] = lambda: {RANK_PID},
    *,
    indices: tuple[int, ...] = (0, 1),
    timeout_s: float = 1.0,
    consecutive: int = 3,
) -> ReleaseResult:
    return wait_released(
        probe,
        list(indices),
        dict(probe.baseline),
        members,
        timeout_s=timeout_s,
        tolerance_bytes=TOLERANCE,
        consecutive=consecutive,
        interval_s=0.05,
        clock=clock,
        sleep=clock.sleep,
    )


def script(probe: FakeProbe, steps: list[str]) -> None:
    """Sample n (1-based) sees ``steps[n-1]``: "held" (a rank holds 40 GiB on GPU 0),
    "free", or "error" (the query fails). After the script the last step repeats."""

    def before(n: int) -> None:
        step = steps[min(n, len(steps)) - 1]
        if step == "held":
            probe.hold(RANK_PID, 0, 40 * GIB)
        else:
            probe.free(RANK_PID)
        if step == "error":
            probe.fail(1)

    probe.before_sample = before


def test_released_at_once_needs_consecutive_clean_samples() -> None:
    probe, clock = FakeProbe(baseline_bytes=BASE), FakeClock()
    result = release(probe, clock, consecutive=3)
    assert result.released
    assert result.samples == 3
    assert all(g.released for g in result.gpus)
    assert result.describe() == f"all 2 GPUs released in {result.elapsed_s:.2f}s"


def test_release_waits_for_the_rank_to_exit() -> None:
    probe, clock = FakeProbe(baseline_bytes=BASE), FakeClock()
    probe.hold(RANK_PID, 0, 40 * GIB)
    clock.at(0.2, lambda: probe.free(RANK_PID))
    result = release(probe, clock, consecutive=2)
    assert result.released
    assert result.elapsed_s >= 0.2
    assert probe.used(0) == BASE


def test_a_dirty_sample_restarts_the_streak() -> None:
    probe, clock = FakeProbe(baseline_bytes=BASE), FakeClock()
    script(probe, ["held", "free", "held", "free", "free", "free"])
    result = release(probe, clock, consecutive=3)
    assert result.released
    assert result.samples == 6  # not 4: the held sample at 3 broke the first streak


def test_a_query_error_resets_the_streak_and_is_never_zero() -> None:
    probe, clock = FakeProbe(baseline_bytes=BASE), FakeClock()
    script(probe, ["free", "free", "error", "free", "free", "free"])
    result = release(probe, clock, consecutive=3)
    assert result.released
    assert result.samples == 6  # the error at 3 counted as "not released", not as a clean zero
    assert result.error == "NVML: Unknown Error"


def test_queries_that_always_fail_never_release() -> None:
    probe, clock = FakeProbe(baseline_bytes=BASE), FakeClock()
    probe.fail(10_000, "NVML: GPU is lost")
    result = release(probe, clock, timeout_s=0.5)
    assert not result.released
    assert "GPU is lost" in result.describe()


def test_a_listed_member_blocks_release_even_at_baseline_memory() -> None:
    """The driver still lists the rank (a zombie context, say) though its memory is back."""
    probe, clock = FakeProbe(baseline_bytes=BASE), FakeClock()
    probe.hold(RANK_PID, 1, 0)
    result = release(probe, clock, timeout_s=0.3)
    assert not result.released
    gpu1 = next(g for g in result.gpus if g.index == 1)
    assert gpu1.member_pids == [RANK_PID]
    assert gpu1.memory_used_bytes == BASE
    assert f"member pids [{RANK_PID}]" in result.describe()
    assert "GPU 1" in result.describe()


def test_a_member_leaving_the_process_list_releases() -> None:
    probe, clock = FakeProbe(baseline_bytes=BASE), FakeClock()
    probe.hold(RANK_PID, 1, 0)
    clock.at(0.1, lambda: probe.free(RANK_PID))
    result = release(probe, clock, timeout_s=1.0, consecutive=2)
    assert result.released


def test_foreign_pids_do_not_block_release_but_are_reported() -> None:
    """Another tenant's process within the tolerance is not ours to wait for."""
    probe, clock = FakeProbe(baseline_bytes=BASE), FakeClock()
    probe.hold(77_777, 0, 100 * MIB)
    result = release(probe, clock)
    assert result.released
    gpu0 = next(g for g in result.gpus if g.index == 0)
    assert gpu0.foreign_pids == [77_777]


def test_memory_within_tolerance_counts_as_released() -> None:
    probe, clock = FakeProbe(baseline_bytes=BASE), FakeClock()
    probe.hold(77_777, 0, TOLERANCE)  # exactly baseline + tolerance
    assert release(probe, clock).released


def test_timeout_names_the_gpu_and_the_mib_held() -> None:
    probe, clock = FakeProbe(baseline_bytes=BASE), FakeClock()
    probe.hold(RANK_PID, 1, 2 * GIB)
    result = release(probe, clock, timeout_s=0.4)
    assert not result.released
    assert result.elapsed_s == pytest.approx(0.4)
    text = result.describe()
    assert text.startswith("GPUs not released after 0.4s")
    assert "GPU 1: 2048 MiB above baseline" in text
    assert "GPU 0" not in text  # only the GPU that is still held is named


def test_timeout_with_only_foreign_memory_names_the_gpu_too() -> None:
    """Foreign memory above the tolerance still keeps the GPU from counting as released."""
    probe, clock = FakeProbe(baseline_bytes=BASE), FakeClock()
    probe.hold(77_777, 0, 3 * GIB)
    result = release(probe, clock, timeout_s=0.2)
    assert not result.released
    assert "GPU 0: 3072 MiB above baseline" in result.describe()


def test_pids_from_another_namespace_leave_memory_alone_to_decide() -> None:
    """In a container NVML lists host pids: membership is impossible, memory decides."""
    probe, clock = FakeProbe(baseline_bytes=BASE, local=False), FakeClock()
    probe.hold(RANK_PID, 0, 0)  # "our" rank is listed, under a host pid, with no memory
    assert release(probe, clock).released

    probe2, clock2 = FakeProbe(baseline_bytes=BASE, local=False), FakeClock()
    probe2.hold(RANK_PID, 0, 4 * GIB)
    result = release(probe2, clock2, timeout_s=0.2)
    assert not result.released
    assert "GPU 0: 4096 MiB above baseline" in result.describe()


def test_members_are_asked_again_at_every_sample() -> None:
    """A member found late (a re-scan) still blocks release."""
    probe, clock = FakeProbe(baseline_bytes=BASE), FakeClock()
    probe.hold(RANK_PID, 0, 0)
    known: set[int] = set()
    clock.at(0.01, lambda: known.add(RANK_PID))
    result = release(probe, clock, lambda: known, consecutive=3, timeout_s=0.3)
    assert not result.released
    assert f"member pids [{RANK_PID}]" in result.describe()


def test_timeout_with_clean_samples_does_not_claim_no_sample_succeeded() -> None:
    probe, clock = FakeProbe(baseline_bytes=BASE), FakeClock()
    result = release(probe, clock, timeout_s=0.1, consecutive=5)
    assert not result.released
    assert all(g.released for g in result.gpus)  # every sample was clean...
    assert "no sample succeeded" not in result.describe()  # ...so don't say none succeeded


def test_resolve_gpus_by_index_and_uuid() -> None:
    probe = FakeProbe(count=3)
    got = resolve_gpus(probe, ["2", probe.gpus[0].uuid.upper()])
    assert [g.index for g in got] == [2, 0]


def test_resolve_gpus_names_the_missing_gpu() -> None:
    probe = FakeProbe(count=2)
    with pytest.raises(ValueError, match="managed GPU '5' does not exist"):
        resolve_gpus(probe, ["0", "5"])
    with pytest.raises(ValueError, match="listed twice"):
        resolve_gpus(probe, ["0", probe.gpus[0].uuid])


@pytest.mark.parametrize("configured", [1, 5])
def test_a_stop_takes_the_configured_number_of_clean_samples(
    tmp_path: Path, configured: int
) -> None:
    """``[timeouts] release_samples`` reaches the release: with the fake server's memory
    gone at once, a stop samples the GPUs exactly that many times (each sample is a
    ``release_sample`` event, what ``/events`` and the CLI show)."""
    rig = make_rig(tmp_path, release_samples=configured)

    async def scenario() -> list[dict[str, object]]:
        await rig.start_ready()
        op = rig.sup.submit_stop()
        await asyncio.wait_for(op.done.wait(), 5)
        assert op.state == "succeeded", op.error
        await until(lambda: rig.sup.state == ServerState.STOPPED, 3, "stopped")
        events = rig.sup.events.recent()
        return [e for e in events if e["kind"] == "release_sample" and e["operation"] == op.id]

    assert len(run(scenario)) == configured


FOREIGN_PID = 77_001


def test_release_fails_fast_when_only_a_foreign_process_holds_memory() -> None:
    """Our rank is gone; a process that is not ours holds 10 GiB above baseline on GPU 1.
    Waiting cannot help (it is never killed): fail after the settle time, naming it,
    instead of waiting out a 60 s timeout."""
    probe, clock = FakeProbe(baseline_bytes=BASE), FakeClock()
    probe.hold(FOREIGN_PID, 1, 10 * GIB)
    result = release(probe, clock, timeout_s=60.0, consecutive=3)
    assert not result.released
    assert result.blocked_by == [FOREIGN_PID]
    assert result.elapsed_s < 5.0
    text = result.describe()
    assert f"pids [{FOREIGN_PID}]" in text and "GPU 1: 10240 MiB above baseline" in text


def test_release_waits_when_memory_above_baseline_is_not_all_foreign() -> None:
    """A foreign process holds 1 GiB, but 40 GiB more are held with no pid listed (our
    memory not yet returned): not blocked by the foreign process while that lasts; once
    it is back, only the foreign process is left and it is named."""
    probe, clock = FakeProbe(baseline_bytes=BASE), FakeClock()
    baseline = dict(probe.baseline)
    probe.hold(FOREIGN_PID, 0, 1 * GIB)
    probe.baseline[0] += 40 * GIB  # held without a pid (the driver is still freeing it)
    clock.at(3.0, lambda: probe.baseline.__setitem__(0, BASE))
    result = wait_released(
        probe,
        [0, 1],
        baseline,
        lambda: {RANK_PID},
        timeout_s=60.0,
        tolerance_bytes=TOLERANCE,
        consecutive=3,
        interval_s=0.05,
        clock=clock,
        sleep=clock.sleep,
    )
    assert result.elapsed_s >= 3.0
    assert result.blocked_by == [FOREIGN_PID]
