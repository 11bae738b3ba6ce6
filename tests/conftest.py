"""Suite-wide guard: no process carrying a test launch tag may outlive the suite."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.helpers import SESSION_TAG_PREFIXES, Daemon, tagged_processes
from tests.slurmkit import SlurmCluster, find_cluster

#: The simulated server's realistic pauses (a 1 s /health_generate, a SIGTERM watchdog
#: looking every 5 s) made short for the suite; tests about them set their own values.
FAST_SIM_ENV = {"SGLANG_SIM_HEALTH_S": "0.01", "SGLANG_SIM_DRAIN_CHECK_S": "0.1"}


@pytest.fixture(scope="session", autouse=True)
def fast_simulated_servers() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in FAST_SIM_ENV}
    for k, v in FAST_SIM_ENV.items():
        os.environ.setdefault(k, v)
    yield
    for k, old in saved.items():
        if old is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = old


@pytest.fixture(scope="session", autouse=True)
def no_stray_processes() -> Iterator[None]:
    yield
    stray = [p for prefix in sorted(SESSION_TAG_PREFIXES) for p in tagged_processes(prefix)]
    described = [describe(p) for p in stray]
    for p in stray:
        with contextlib.suppress(psutil.Error):
            p.kill()
    assert not stray, f"processes of the test suite left running: {described}"


def describe(p: psutil.Process) -> str:
    try:
        return f"pid {p.pid} ppid {p.ppid()} {p.status()} {' '.join(p.cmdline())[:120]} " + str(
            {k: v for k, v in p.environ().items() if k.startswith("SGLANG_")}
        )
    except psutil.Error as exc:
        return f"pid {p.pid}: {exc}"


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[type[Daemon]]:
    """Start daemons with ``daemon_factory(...)``-like calls; all are stopped afterwards."""
    started: list[Daemon] = []

    class _Factory(Daemon):
        def __init__(self, **kw: object) -> None:
            sub = tmp_path / f"d{len(started)}"
            sub.mkdir()
            super().__init__(sub, **kw)  # type: ignore[arg-type]
            started.append(self)

    yield _Factory
    for d in started:
        if d.proc is not None and d.proc.poll() is None:
            # Every test ends with what an operator's `systemctl stop` must give: exit 0
            # and nothing of the daemon's left running.
            assert d.stop() == 0, d.log()
            assert tagged_processes(d.instance) == [], f"left running by {d.instance}"
        d.client.close()


@pytest.fixture(scope="session")
def readonly_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon (4 simulated GPUs, the default levers) shared by the tests that only
    read from it or are refused by it: a test that changes its levers or its server does
    not belong here (use ``daemon_factory``). Stopped at the end like every daemon."""
    d = Daemon(tmp_path_factory.mktemp("readonly-daemon")).start()
    try:
        yield d
        state = d.status()
        assert state["state"] == "ready" and state["levers"]["mem_fraction_static"] == 0.85, (
            "a test changed the read-only daemon"
        )
    finally:
        if d.proc is not None and d.proc.poll() is None:
            assert d.stop() == 0, d.log()
            assert tagged_processes(d.instance) == [], f"left running by {d.instance}"
        d.client.close()


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    """The two-node Slurm test cluster (tests/slurmkit.py): a skip without one, a
    failure under CI=true."""
    return find_cluster()
