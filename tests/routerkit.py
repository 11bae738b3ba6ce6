"""The real sglang-router for tests and benchmarks: started on a loopback port from its own
environment (``scripts/router-env.sh``), stopped with SIGTERM then SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON_ENV = "SGLANG_SUPERVISOR_TEST_ROUTER_PYTHON"
ROUTER_PYTHON = os.environ.get(PYTHON_ENV, str(ROOT / ".venv-router" / "bin" / "python"))


def router_available() -> bool:
    if PYTHON_ENV in os.environ and not Path(ROUTER_PYTHON).exists():
        # The test command built it and said where: missing now is a failure, never a skip.
        raise RuntimeError(f"{PYTHON_ENV}={ROUTER_PYTHON} does not exist")
    return Path(ROUTER_PYTHON).exists()


def needs_router() -> pytest.MarkDecorator:
    """A module's ``pytestmark``: skipped without the router's environment."""
    return pytest.mark.skipif(
        not router_available(), reason="no sglang-router: run scripts/router-env.sh"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Router:
    """One sglang-router process with no workers, listening on 127.0.0.1."""

    def __init__(self, log: Path, *extra: str, api_key: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        argv = [ROUTER_PYTHON, "-m", "sglang_router.launch_router", "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--log-level", "warn", *extra]
        # Its Prometheus exporter listens on 0.0.0.0:29000 by default: two routers at once
        # (parallel test workers, the benchmark's configurations) would collide there.
        argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        if api_key:
            argv += ["--api-key", api_key]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={k: v for k, v in os.environ.items() if not k.endswith("_proxy")},
            )
        self._wait_live(30.0)

    def _wait_live(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sglang-router exited {self.proc.returncode}: {self.tail()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/liveness", timeout=2).status_code == 200:
                    return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"sglang-router not live after {timeout_s}s: {self.tail()}")
            time.sleep(0.05)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def workers(self, api_key: str | None = None) -> list[dict[str, object]]:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        r = httpx.get(f"{self.url}/workers", headers=headers, timeout=5)
        r.raise_for_status()
        return list(r.json()["workers"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    """A router with no workers, stopped after the test."""
    r = Router(tmp_path / "router.log")
    try:
        yield r
    finally:
        r.stop()
