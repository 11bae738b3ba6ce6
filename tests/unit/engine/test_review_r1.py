"""Review r1 of the engine split and the #23 merges: each test failed before its fix.

- A SIGHUP that changes ``[timeouts] diagnosis_hold_s`` takes effect (the reload logs it
  as changed; the diagnoser read it once, at construction).
- A telemetry read that outlives its server (a stop, an apply) does not write that
  server's figures into the record afterwards.
- With ``levers_source = "config"``, a SIGHUP (a certificate renewal's ``systemctl
  reload``...) does not start a server an operator stopped.
- With ``levers_source = "config"``, a server recorded for adoption that is gone (a
  reboot with ``keep_server_on_exit``) does not keep the file's levers from winning.
- The daemon that refuses to start on invalid configured levers says what to fix, where.
- With ``levers_source = "config"``, the file's levers that differ from the last-good set
  start like an apply's (probation, then the last-good levers back if they fail), not
  retried until a crash loop leaves nothing serving.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor.engine import checks
from sglang_supervisor.engine.errors import Busy
from sglang_supervisor.observe.telemetry import Throughput
from sglang_supervisor.operations import SUCCEEDED
from sglang_supervisor.planner.diagnosis import LoadKind
from sglang_supervisor.states import ServerState
from sglang_supervisor_api.reconcile import after_sighup
from tests.unit.engine.common import apply, settle
from tests.unit.fakes import (
    INITIAL_LEVERS,
    Behaviour,
    FakeProbe,
    FakeProcessOps,
    make_rig,
    run,
)

KV_BOUND = Throughput(running_requests=80, queued_requests=240, token_usage=0.998)


def test_a_reloaded_diagnosis_hold_takes_effect(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, diagnosis_hold_s=180.0)

    async def main() -> None:
        diagnoser = rig.sup.parts.diagnoser
        diagnoser.observe(KV_BOUND)
        view = rig.sup.view()
        assert view.diagnosis is not None and view.diagnosis.kind is LoadKind.NO_METRICS
        # What api/reload.py does on a SIGHUP: the running settings take the new timeouts.
        settings = rig.sup.settings
        settings.timeouts = settings.timeouts.model_copy(update={"diagnosis_hold_s": 0.0})
        diagnoser.observe(KV_BOUND)
        view = rig.sup.view()
        assert view.diagnosis is not None
        assert view.diagnosis.kind is LoadKind.KV_BOUND, view.diagnosis
        assert view.diagnosis.evidence["hold_s"] == 0.0

    run(main)


DECODE_LINE = (
    "[2026-12-01 10:00:00] Decode batch, #running-req: 77, #token: 9000, token usage: 0.99, "
    "gen throughput (token/s): 1234.0, #queue-req: 55\n"
)


def test_a_telemetry_read_that_outlives_its_server_writes_nothing(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        server = rig.sup.server
        assert server is not None
        # /metrics does not answer; the log's last decode line is the fallback.
        with open(server.handle.log_path, "a", encoding="utf-8") as f:
            f.write(DECODE_LINE)
        asked, answer = asyncio.Event(), asyncio.Event()

        async def slow_metrics(url: str, timeout_s: float) -> str | None:
            asked.set()
            await answer.wait()
            return None

        rig.health.metrics_text = slow_metrics  # type: ignore[method-assign]
        read = asyncio.create_task(rig.sup.watch._read_telemetry())
        await asyncio.wait_for(asked.wait(), 5)
        await settle(rig, rig.sup.submit_stop())  # the server is gone meanwhile
        assert rig.sup.server is None
        answer.set()
        await read
        # Stopped: no load to show, not the figures of the server that was stopped.
        assert rig.sup.throughput.running_requests is None, rig.sup.throughput
        assert rig.sup.view().status_json([])["throughput"]["source"] is None
        await rig.sup.shutdown()

    run(main)


def test_a_sighup_does_not_start_a_server_an_operator_stopped(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        await settle(rig, rig.sup.submit_stop())
        assert rig.sup.state == ServerState.STOPPED
        settings = rig.sup.settings
        # The config as it was, but levers_source = "config": nothing to change.
        server = settings.server.model_copy(update={"levers_source": "config"})
        new = settings.model_copy(update={"server": server})
        tasks: set[asyncio.Task[Any]] = set()
        after_sighup(rig.sup, new, tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        op = rig.sup.operation
        if op is not None:
            await settle(rig, op)
        # Stopped it stays, until an operator starts it; the drift shows the config.
        assert rig.sup.state == ServerState.STOPPED, rig.sup.state_reason
        assert len(rig.procs.spawns) == 1
        desired = rig.sup.view().desired
        assert desired is not None and desired.source == "config"
        await rig.sup.shutdown()

    run(main)


def test_config_levers_win_at_a_reboot_after_keep_server(tmp_path: Path) -> None:
    procs = FakeProcessOps(FakeProbe())
    first = make_rig(tmp_path, procs=procs)

    async def before() -> None:
        await first.start_ready()
        await first.sup.shutdown(keep_server=True)  # recorded for the next daemon

    run(before)
    procs.crash(procs.handles[0], returncode=-9)  # the reboot: nothing of it survives
    server = first.settings.server.model_copy(
        update={"levers_source": "config", "levers": {**INITIAL_LEVERS, "mem_fraction_static": 0.7}}
    )
    second = make_rig(
        tmp_path, procs=procs, settings=first.settings.model_copy(update={"server": server})
    )

    async def after() -> None:
        await second.start_ready()
        argv = procs.spawns[-1].argv
        assert argv[argv.index("--mem-fraction-static") + 1] == "0.7"
        status = await second.sup.status()
        assert status["levers"]["mem_fraction_static"] == 0.7
        assert status["drift"] == []
        await second.sup.shutdown()

    run(after)


def test_invalid_configured_levers_say_where_to_fix_them(tmp_path: Path) -> None:
    rig = make_rig(tmp_path, levers={"model_path": "m", "mem_fraction": 0.9})

    async def main() -> None:
        with pytest.raises(ValueError) as caught:
            await rig.sup.start()
        message = str(caught.value)
        assert "mem_fraction" in message and "[server.levers]" in message, message
        assert "start the daemon again" in message, message
        assert rig.procs.spawns == []

    run(main)


def test_config_levers_that_fail_at_start_roll_back_to_the_last_good(tmp_path: Path) -> None:
    procs = FakeProcessOps(FakeProbe())
    first = make_rig(tmp_path, procs=procs)

    async def before() -> None:
        await first.start_ready()  # 0.8 serves and is last-good
        await first.sup.shutdown()

    run(before)
    server = first.settings.server.model_copy(
        update={"levers_source": "config", "levers": {**INITIAL_LEVERS, "mem_fraction_static": 0.7}}
    )
    second = make_rig(
        tmp_path, procs=procs, settings=first.settings.model_copy(update={"server": server})
    )
    procs.plan(Behaviour(exit_on_start=1))  # the file's 0.7 does not start (an OOM...)

    async def after() -> None:
        await second.sup.start()
        op = second.sup.operation
        assert op is not None
        await settle(second, op)
        assert op.state == "rolled_back", (op.state, op.error)
        assert "config" in (op.error or ""), op.error
        argv = procs.spawns[-1].argv
        assert argv[argv.index("--mem-fraction-static") + 1] == "0.8"
        assert second.sup.state == ServerState.READY
        status = await second.sup.status()
        assert status["levers"]["mem_fraction_static"] == 0.8
        assert [d["lever"] for d in status["drift"]] == ["mem_fraction_static"]
        await second.sup.shutdown()

    run(after)


def test_the_server_in_hand_cannot_be_changed_through_a_reader(tmp_path: Path) -> None:
    """The one-writer rule's hole: a reader holding ``record.server`` (a ``ServerInfo``)
    could set its fields. It is frozen; the record replaces it when the server is ready,
    and the watcher still knows it as the same launch."""
    rig = make_rig(tmp_path)

    async def main() -> None:
        await rig.start_ready()
        server = rig.sup.server
        assert server is not None and server.ready_at is not None
        with pytest.raises(dataclasses.FrozenInstanceError):
            server.ready_at = "now"  # type: ignore[misc]
        await rig.sup.shutdown()

    run(main)


def test_an_apply_checked_while_another_committed_does_not_undo_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two operators at once: B's request is merged onto the levers of when it arrived,
    then validated (seconds, cold); A's apply runs and commits meanwhile. B must not
    silently put A's lever back: 409, nothing changed, A's levers serve."""
    rig = make_rig(tmp_path)
    original = checks.before_the_stop
    a_committed = asyncio.Event()
    b_checking = asyncio.Event()

    async def slow_for_b(parts: Any, record: Any, requested: Any, op: Any) -> Any:
        result = await original(parts, record, requested, op)
        if requested.levers.get("chunked_prefill_size") == 4096:  # B
            b_checking.set()
            await a_committed.wait()
        return result

    monkeypatch.setattr(checks, "before_the_stop", slow_for_b)

    async def main() -> None:
        await rig.start_ready()
        b = asyncio.ensure_future(rig.sup.submit_apply({"chunked_prefill_size": 4096}, {}))
        await b_checking.wait()
        a = await apply(rig, {"mem_fraction_static": 0.9})
        assert a.state == SUCCEEDED
        pid = rig.sup.server.handle.pid if rig.sup.server else None
        a_committed.set()
        with pytest.raises(Busy, match=f"changed while this request was checked .*{a.id}"):
            await b
        assert rig.sup.levers.levers["mem_fraction_static"] == 0.9
        assert "chunked_prefill_size" not in rig.sup.levers.levers
        assert rig.sup.server is not None and rig.sup.server.handle.pid == pid
        await rig.sup.shutdown()

    run(main)
