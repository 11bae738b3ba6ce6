"""What the daemon's SIGTERM/SIGINT do, with one owner for "a second one forces": the
supervisor's ``request_shutdown``. The daemon only mirrors it onto uvicorn."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fastapi import FastAPI

from sglang_supervisor_api.stopping import Stopping
from tests.unit.fakes import make_rig, run


def stopping_for(tmp_path: Path) -> tuple[Stopping, Any, Any]:
    rig = make_rig(tmp_path)
    app = FastAPI()
    app.state.closing = asyncio.Event()
    server = SimpleNamespace(should_exit=False, force_exit=False)
    reloads: list[int] = []
    stopping = Stopping(rig.sup, app, server, lambda: reloads.append(1))  # type: ignore[arg-type]
    return stopping, rig.sup, server


def test_the_first_sigterm_stops_gracefully_and_the_second_forces(tmp_path: Path) -> None:
    async def main() -> None:
        stopping, sup, server = stopping_for(tmp_path)
        stopping.on_signal(signal.SIGTERM)
        assert server.should_exit and not server.force_exit
        assert sup.shutdown_requested and not sup.shutdown_forced
        assert stopping.requested.is_set()
        stopping.on_signal(signal.SIGINT)
        assert server.force_exit
        assert sup.shutdown_forced  # no drain, no grace period: the supervisor's teardown
        stopping.on_signal(signal.SIGTERM)  # a third changes nothing more
        assert server.force_exit and sup.shutdown_forced

    run(main)


def test_a_sigterm_while_the_supervisor_already_shuts_down_forces(tmp_path: Path) -> None:
    async def main() -> None:
        stopping, sup, server = stopping_for(tmp_path)
        sup.request_shutdown()  # the daemon's exit path began without a signal
        stopping.on_signal(signal.SIGTERM)
        assert sup.shutdown_forced and server.force_exit

    run(main)


def test_sighup_reloads_and_stops_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        stopping, sup, server = stopping_for(tmp_path)
        stopping.on_signal(signal.SIGHUP)
        assert not server.should_exit and not sup.shutdown_requested

    run(main)
