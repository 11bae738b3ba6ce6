"""The API answers while the daemon's start-up still loads (issue 20 §5): /healthz and
/status at once, saying what is loading; a mutating call answers 503 with Retry-After
(nothing changes) until start-up is done, then everything works as before."""

from __future__ import annotations

import stat
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import Daemon, wait_until

#: How long the slow ``server.python`` takes to say which SGLang it has.
SLOW_S = 8


def slow_python(tmp: Path) -> str:
    """A ``server.python`` that takes ``SLOW_S`` per run (as an SGLang import does)."""
    wrapper = tmp / "slow-python"
    wrapper.write_text(f'#!/bin/sh\nsleep {SLOW_S}\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


def test_the_api_answers_while_start_up_reads_the_schema(tmp_path: Path) -> None:
    d = Daemon(tmp_path, extra={"server": {"python": slow_python(tmp_path)}})
    d.spawn()
    try:
        first: dict[str, Any] = {}

        def healthz() -> bool:
            assert d.proc is not None and d.proc.poll() is None, d.log()
            try:
                r = d.client.get("/healthz", timeout=1)
            except httpx.HTTPError:
                return False
            first.update(r.json())
            return r.status_code == 200

        wait_until(healthz, 60, 0.02, "/healthz")
        # Answered while start-up still waits on server.python: it says what it loads.
        assert first["loading"] is not None and "schema" in first["loading"], first
        status = d.status()
        assert status["loading"] is not None and "schema" in status["loading"]
        assert status["server"] is None and status["sglang"]["validation"] == "checking"
        # Issue 27 §7: named for what it is — not "stopped", which a client polling the
        # state would take for a server that is not running.
        assert first["state"] == "loading" and status["state"] == "loading", status
        metrics = d.client.get("/metrics").text
        assert 'sglang_supervisor_state{state="loading"} 1.0' in metrics
        assert 'sglang_supervisor_state{state="stopped"} 0.0' in metrics
        r = d.apply({"mem_fraction_static": 0.8})
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "1"
        assert "still starting" in r.json()["detail"]["message"]
        assert d.client.post("/stop").status_code == 503
        # Then start-up ends and the daemon works as ever.
        wait_until(lambda: d.status()["loading"] is None, 60, 0.05, "start-up done")
        d.wait_state("ready", timeout=60)
        s = d.status()
        assert s["sglang"]["validation"] == "degraded", s["sglang"]
        assert "no SGLang" in s["sglang"]["reason"]
        assert s["levers"]["mem_fraction_static"] == 0.85  # the 503 changed nothing
        r = d.apply({"mem_fraction_static": 0.8})
        assert r.status_code == 200 and r.json()["operation"]["state"] == "succeeded", r.text
    finally:
        assert d.stop() == 0
        d.client.close()
