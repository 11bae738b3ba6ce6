"""Shared test helpers: waiting on conditions with deadlines, free ports, a real daemon."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil
import pytest

T = TypeVar("T")
TEST_INSTANCE_PREFIX = "sgs-test"
TAG_ENV = "SGLANG_SUPERVISOR_INSTANCE"
#: What every client of the daemon sends (a POST without it is refused: docs/api.md).
JSON_HEADERS = {"Content-Type": "application/json"}
#: Launch-tag prefixes of everything this test session started: the suite-wide guard
#: checks these (not every "sgs-test" tag: another session may be running beside us).
SESSION_TAG_PREFIXES: set[str] = set()


def register_tag(prefix: str) -> str:
    """Note a launch-tag prefix this session uses, so the guard can check it; returns it."""
    SESSION_TAG_PREFIXES.add(prefix)
    return prefix


def wait_until(
    pred: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, what: str = "condition"
) -> T:
    """Poll ``pred`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: T = pred()
    while not last:
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
        last = pred()
    return last


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def tagged_processes(prefix: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose environment carries a launch tag with ``prefix``."""
    out = []
    for p in psutil.process_iter():
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        needle = f"{TAG_ENV}={prefix}".encode()
        if any(item.startswith(needle) for item in env.split(b"\0")):
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                continue
    return out


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(value)


def write_toml(path: Path, data: dict[str, Any]) -> None:
    lines: list[str] = []

    def section(prefix: str, table: dict[str, Any]) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        tables = {k: v for k, v in table.items() if isinstance(v, dict)}
        if prefix:
            lines.append(f"[{prefix}]")
        lines.extend(f"{k} = {_toml(v)}" for k, v in scalars.items())
        for k, v in tables.items():
            section(f"{prefix}.{k}" if prefix else k, v)

    section("", data)
    path.write_text("\n".join(lines) + "\n")


FAST_TIMEOUTS: dict[str, Any] = {
    "stop_grace_s": 2.0,
    "kill_timeout_s": 10.0,
    "release_timeout_s": 10.0,
    "release_samples": 2,
    "ready_timeout_s": 20.0,
    "probation_s": 0.5,
    "liveness_interval_s": 0.3,
    "liveness_timeout_s": 2.0,
    "liveness_failures": 2,
    "backoff_initial_s": 0.1,
    "backoff_max_s": 0.5,
    "crash_loop_count": 3,
}


def _deep_merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = value


class Daemon:
    """A real ``sglang-supervisor serve --simulate`` process for one test."""

    def __init__(
        self,
        tmp: Path,
        *,
        gpus: int = 4,
        levers: dict[str, Any] | None = None,
        timeouts: dict[str, Any] | None = None,
        sim: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.dir = tmp
        self.port = free_port()
        self.server_port = free_port()
        self.instance = register_tag(f"{TEST_INSTANCE_PREFIX}-{uuid.uuid4().hex[:8]}")
        config: dict[str, Any] = {
            "simulate": True,
            "instance": self.instance,
            "state_dir": str(tmp / "state"),
            "api": {"host": "127.0.0.1", "port": self.port},
            "server": {
                "port": self.server_port,
                "levers": levers
                or {"model_path": "sim/llama", "tp_size": gpus, "mem_fraction_static": 0.85},
            },
            "timeouts": {**FAST_TIMEOUTS, **(timeouts or {})},
            # A fast simulated model load and /health_generate (1 s by default).
            "sim": {
                "gpus": gpus,
                "startup_s": 0.2,
                "health_s": 0.05,
                # Pinning and unpinning a test's host cache cost nothing (the H200 figures
                # would add seconds per GiB: a test that measures them sets its own).
                "pin_s_per_gib": 0.0,
                "unpin_s_per_gib": 0.0,
                **(sim or {}),
            },
        }
        _deep_merge(config, extra or {})
        self.config_path = tmp / "config.toml"
        write_toml(self.config_path, config)
        self.url = f"http://127.0.0.1:{self.port}"
        # The daemon refuses a POST without Content-Type: application/json (a page on
        # another site cannot send one); every client says it, as the CLI does.
        self.client = httpx.Client(
            base_url=self.url, timeout=60, trust_env=False, headers=JSON_HEADERS
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = tmp / "daemon.log"
        #: Extra environment of the daemon process (e.g. its API token).
        self.env: dict[str, str] = {}
        #: Extra options of ``serve`` (e.g. ``--log-format json``).
        self.args: list[str] = []

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the daemon's process and return at once (``start`` also waits)."""
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sglang_supervisor_api.cli",
                "serve",
                "--config",
                str(self.config_path),
                *self.args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**{k: v for k, v in os.environ.items() if k != TAG_ENV}, **self.env},
        )
        log.close()
        return self.proc

    def start(self, wait_ready: bool = True) -> Daemon:
        self.spawn()
        return self.wait_started(wait_ready)

    def wait_started(self, wait_ready: bool = True) -> Daemon:
        """After ``spawn``: wait as ``start`` does (several daemons spawned first start
        side by side)."""
        # The API answers at once; start-up reads the live schema beside it (with
        # server.python an SGLang environment that imports SGLang: 10-30 s on a loaded
        # 2-core machine), and mutating calls answer 503 until then: wait for that too.
        wait_until(self._healthy, 120, 0.05, "the daemon's /healthz with nothing loading")
        if wait_ready:
            self.wait_state("ready")
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.log()}")
        try:
            r = self.client.get("/healthz", timeout=1)
            return r.status_code == 200 and r.json().get("loading") is None
        except (httpx.HTTPError, ValueError):
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def status(self) -> dict[str, Any]:
        r = self.client.get("/status")
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data

    def status_or_none(self) -> dict[str, Any] | None:
        """/status, or None when the daemon does not answer."""
        try:
            return self.status()
        except httpx.HTTPError:
            return None

    def wait_state(self, state: str, timeout: float = 30) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            s = self.status_or_none()
            if s is None:
                return None
            return s if s["state"] == state and s["operation"] is None else None

        return wait_until(check, timeout, 0.05, f"state {state!r}")

    def apply(
        self,
        levers: dict[str, Any] | None = None,
        env: dict[str, Any] | None = None,
        wait: bool = True,
        **body: Any,
    ) -> httpx.Response:
        payload = {"levers": levers or {}, "env": env or {}, **body}
        return self.client.post("/levers", params={"wait": str(wait).lower()}, json=payload)

    def gpu_used(self) -> list[int]:
        return [g["memory_used_bytes"] for g in self.status()["gpus"]]

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM the daemon; return its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                raise AssertionError(
                    f"daemon ignored SIGTERM for {timeout}s:\n{self.log()}"
                ) from None
        return self.proc.returncode


def serve_refusal(
    tmp: Path, config: str, *args: str, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """``serve`` with ``config``, expected to refuse at once: (exit code, stderr). One that
    starts anyway is stopped (SIGTERM: the daemon stops its server) and reported as -1."""
    cfg = tmp / "c.toml"
    cfg.write_text(config)
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SGLANG_SUPERVISOR_TOKEN", "SGLANG_SUPERVISOR_READ_TOKEN")
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sglang_supervisor_api.cli",
            "serve",
            "--simulate",
            "--config",
            str(cfg),
            "--state-dir",
            str(tmp / "s"),
            "--port",
            "0",
            "--server-port",
            str(free_port()),
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**base, **(env or {})},
    )
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
        return -1, f"the daemon started instead of refusing:\n{err}"
    return proc.returncode, err


NOBODY = 65534
AS_NOBODY = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
#: Another user's process holding an abstract name: listening without ever accepting
#: (its backlog of one fills), or bound without listening.
SQUAT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(bytes.fromhex(sys.argv[1]))
if sys.argv[2] == "listen":
    s.listen(0)
print("held", flush=True)
sys.stdin.read()
"""


@contextmanager
def squatter(name: bytes, how: str = "listen") -> Iterator[int]:
    """uid 65534 (``nobody``) holding the abstract socket ``name`` until the block ends
    (``how``: "listen" or "bind" only); yields its pid. Skips unless root."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user (setpriv)")
    proc = subprocess.Popen(
        [*AS_NOBODY, "/usr/bin/python3", "-c", SQUAT, name.hex(), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(10)


def proc_state(pid: int) -> str:
    """What the kernel says of ``pid`` (its state, the signals it ignores and catches, where
    it sleeps): for a process that did not react to a signal in time."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError as exc:
        return f"pid {pid}: {exc}"
    keep = [x for x in status if x.split(":")[0] in ("State", "SigIgn", "SigCgt", "SigBlk")]
    return f"pid {pid}: {'; '.join(keep)}; wchan {wchan}"
