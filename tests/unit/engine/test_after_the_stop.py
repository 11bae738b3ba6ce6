"""After the stop, every path ends in the new server, the last-good levers, or a named
``failed`` — and nothing an operation leaves behind wedges the daemon (issue 11, §4).

Driven through the fakes; the assertions are what an operator sees: which levers
/status shows and a start launches, which pid serves, the operation's outcome.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from sglang_supervisor.engine import checks
from sglang_supervisor.operations import FAILED, ROLLED_BACK, SUCCEEDED
from sglang_supervisor.sglang.levers import LeverError
from sglang_supervisor_api.app import create_app
from tests.unit.engine.common import HELD_PER_RANK, S, apply, nothing_held, settle, state_of
from tests.unit.fakes import GIB, INITIAL_LEVERS, Behaviour, make_rig, run, until

GOOD = {"levers": INITIAL_LEVERS, "env": {}}


def test_an_unexpected_error_at_spawn_rolls_back_to_the_last_good_levers(
    tmp_path: Path,
) -> None:
    """Popen raised UnicodeEncodeError (a value with a lone surrogate): not an OSError,
    yet the apply rolls back instead of leaving the state 'starting' with no process."""
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.spawn_error = UnicodeEncodeError(
            "utf-8", "\ud800", 0, 1, "surrogates not allowed"
        )
        op = await apply(rig, {"mem_fraction_static": 0.9})
        assert op.state == ROLLED_BACK, op.error
        assert "UnicodeEncodeError" in (op.error or "")
        assert state_of(rig) == S.READY
        serving = rig.procs.current()
        assert serving is not None and serving is rig.procs.handles[-1]
        status = await rig.sup.status()
        assert status["levers"] == INITIAL_LEVERS
        assert status["server"]["pid"] == serving.pid
        assert rig.probe.above_baseline() == {0: HELD_PER_RANK, 1: HELD_PER_RANK}
        # The daemon is not wedged: the next operation runs.
        again = await apply(rig, {"mem_fraction_static": 0.85})
        assert again.state == SUCCEEDED
        await rig.sup.shutdown()

    run(main)


def test_levers_change_only_at_commit_even_when_the_rollback_cannot_release(
    tmp_path: Path,
) -> None:
    """The new server never gets ready and its ranks cannot be killed: the apply ends
    failed. /status must still show the last-good levers, and a start launches them,
    not the rejected ones."""
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        rig.procs.plan(Behaviour(never_ready=True, unkillable=True))
        op = await apply(rig, {"mem_fraction_static": 0.9})
        assert op.state == FAILED
        assert state_of(rig) == S.FAILED
        status = await rig.sup.status()
        assert status["levers"] == INITIAL_LEVERS
        assert status["last_good_levers"] == GOOD
        rig.procs.release_stuck()
        start = await settle(rig, await rig.sup.submit_start())
        assert start.state == SUCCEEDED, start.error
        argv = rig.procs.spawns[-1].argv
        assert argv[argv.index("--mem-fraction-static") + 1] == "0.8"
        await rig.sup.shutdown()

    run(main)


def test_a_server_unhealthy_in_probation_is_rolled_back_and_never_last_good(
    tmp_path: Path,
) -> None:
    """The new server answers once, then /health_generate times out while its pid stays
    alive: probation fails it; the last-good levers serve again."""
    rig = make_rig(tmp_path, probation_s=0.5)

    async def main() -> None:
        await rig.start_ready()
        op = await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        await until(lambda: len(rig.procs.spawns) == 2 and state_of(rig) == S.READY)
        new = rig.procs.handles[1]
        new.hung = True
        await settle(rig, op)
        assert op.state == ROLLED_BACK, op.error
        assert "unhealthy within the probation window" in (op.rollback_reason or "")
        assert f"pid {new.pid}" in (op.rollback_reason or "")
        assert new.returncode is not None
        status = await rig.sup.status()
        assert status["last_good_levers"] == GOOD
        assert status["levers"] == INITIAL_LEVERS
        assert rig.procs.current() is rig.procs.handles[2]
        await rig.sup.shutdown()
        assert nothing_held(rig)

    run(main)


# ------------------------------------------------ start, restart: preflight first


def test_restart_with_a_foreign_process_on_a_gpu_is_refused_before_the_stop(
    tmp_path: Path,
) -> None:
    """A process that is not ours holds 10 GiB on GPU 1: a restart is refused with its
    pid named, like an apply, and the healthy server is not touched."""
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        serving = rig.procs.handles[0]
        rig.probe.hold(99_999, 1, 10 * GIB)
        with pytest.raises(LeverError, match="pid 99999"):
            await rig.sup.submit_restart()
        assert rig.procs.current() is serving
        assert rig.procs.teardowns == []
        assert state_of(rig) == S.READY
        app = create_app(rig.sup)
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers={"Content-Type": "application/json"}
        ) as client:
            r = await client.post("/restart")
        assert r.status_code == 422
        assert "pid 99999" in r.text
        assert rig.procs.current() is serving and len(rig.procs.spawns) == 1
        rig.probe.free(99_999)
        await rig.sup.shutdown()

    run(main)


def test_start_just_after_the_launcher_died_cleans_up_and_starts(tmp_path: Path) -> None:
    """The launcher died (its ranks orphaned, still holding memory) and the watcher has
    not noticed yet: a start must not answer 'already ready'."""
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        await rig.sup.watch.stop()  # the crash is not noticed before the operator's start
        dead = rig.procs.handles[0]
        rig.procs.crash(dead, orphan_ranks=True)
        op = await settle(rig, await rig.sup.submit_start())
        assert op.state == SUCCEEDED, op.error
        assert "nothing to do" not in str([p.detail for p in op.phases])
        assert len(rig.procs.spawns) == 2
        assert not set(dead.rank_pids) & rig.procs.alive_pids()
        assert (await rig.sup.status())["server"]["pid"] == rig.procs.handles[1].pid
        assert rig.probe.above_baseline() == {0: HELD_PER_RANK, 1: HELD_PER_RANK}
        await rig.sup.shutdown()

    run(main)


def test_a_stop_blocked_only_by_a_foreign_process_fails_at_once_naming_it(
    tmp_path: Path,
) -> None:
    """A process that is not ours took 10 GiB on GPU 1 after the baseline: once our
    server is gone, waiting the 60 s release timeout cannot help."""
    rig = make_rig(tmp_path, release_timeout_s=60.0, release_samples=3)

    async def main() -> None:
        await rig.start_ready()
        rig.probe.hold(99_999, 1, 10 * GIB)
        op = await settle(rig, rig.sup.submit_stop(), timeout=10.0)
        assert op.state == FAILED
        assert "belongs to pids [99999]" in (op.error or "")
        assert state_of(rig) == S.FAILED
        assert rig.procs.alive_pids() == set()
        assert 99_999 in {
            p["pid"] for g in (await rig.sup.status())["gpus"] for p in g["processes"]
        }
        rig.probe.free(99_999)
        await rig.sup.shutdown()

    run(main)


def test_a_full_or_unwritable_state_dir_is_refused_before_the_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new levers could not be persisted (disk full) or the server's log not kept
    (the logs directory is not writable): refused by preflight, nothing stopped."""
    rig = make_rig(tmp_path)

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    async def main() -> None:
        await rig.start_ready()
        serving = rig.procs.handles[0]
        with monkeypatch.context() as m:
            m.setattr(os, "fsync", disk_full)
            with pytest.raises(LeverError, match=r"state_dir: .*\(No space left on device\)"):
                await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        logs = rig.sup.store.logs_dir
        shutil.move(logs, tmp_path / "logs-moved")
        logs.write_text("not a directory")  # even root cannot write into it
        with pytest.raises(
            LeverError, match=f"state_dir: {re.escape(str(logs))} cannot be written"
        ):
            await rig.sup.submit_apply({"mem_fraction_static": 0.9}, {})
        with pytest.raises(LeverError, match="state_dir"):
            await rig.sup.submit_restart()
        assert rig.procs.current() is serving and len(rig.procs.spawns) == 1
        assert rig.procs.teardowns == []
        assert state_of(rig) == S.READY
        await rig.sup.shutdown()

    run(main)


def test_concurrent_preflights_do_not_trip_over_each_others_probe_file(tmp_path: Path) -> None:
    """Dry runs and applies preflight concurrently: each write probe is its own file."""
    logs = tmp_path / "logs"
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: checks.state_dir_problems(tmp_path, logs), range(160)))
    assert all(r == [] for r in results), next(r for r in results if r)
