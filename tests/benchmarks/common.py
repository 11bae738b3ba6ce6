"""Shared pieces of the benchmarks: statistics, tables, the simulated server tree, cleanup.

Every benchmark module has ``run(ctx: Context) -> Result``. A ``Result`` carries the
tables printed to the terminal and written to ``results/cpu_benchmarks.md``, and the raw
measurements written to ``results/cpu_benchmarks.json``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from sglang_supervisor.config import TimeoutSettings
from sglang_supervisor.host import process
from sglang_supervisor.sim.gpus import SimGpuProbe, prepare_registry, sim_gpu_uuid
from tests.helpers import Daemon

TAG_ENV = process.TAG_ENV
#: Launch tags of processes the benchmarks start themselves (not through a daemon).
BENCH_TAG_PREFIX = "sgs-bench"
SIM_MEMORY_MIB = 143771
GIB = 2**30

#: The production defaults of ``[timeouts]`` (``sglang_supervisor.config.TimeoutSettings``), so
#: that a benchmark daemon runs what an operator runs, unlike the tests' fast ones; only
#: ``ready_timeout_s`` is shorter (a broken start fails in 2 minutes, not 30).
PRODUCTION = TimeoutSettings()
DEFAULT_TIMEOUTS: dict[str, Any] = {**PRODUCTION.model_dump(), "ready_timeout_s": 120.0}


# --- statistics and tables ----------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by linear interpolation (numpy's default)."""
    s = sorted(values)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summary(values: Sequence[float]) -> dict[str, float]:
    """n, median, min, max, p25, p75, p99 of ``values``."""
    v = [float(x) for x in values]
    if not v:
        return {"n": 0}
    return {
        "n": len(v),
        "median": statistics.median(v),
        "min": min(v),
        "max": max(v),
        "p25": pct(v, 0.25),
        "p75": pct(v, 0.75),
        "p99": pct(v, 0.99),
    }


def ms(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x * 1000:.{digits}f}"


def spread_ms(values: Sequence[float], digits: int = 1) -> str:
    """``min–max`` in milliseconds."""
    if not values:
        return "—"
    return f"{min(values) * 1000:.{digits}f}–{max(values) * 1000:.{digits}f}"


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "—"
    return f"{a / b:.2f}"


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""

    def markdown(self) -> str:
        out = [f"**{self.title}**", ""]
        out.append("| " + " | ".join(self.headers) + " |")
        out.append("|" + "---|" * len(self.headers))
        out.extend("| " + " | ".join(r) + " |" for r in self.rows)
        if self.note:
            out += ["", self.note]
        return "\n".join(out)

    def text(self) -> str:
        widths = [len(h) for h in self.headers]
        for r in self.rows:
            widths = [max(w, len(c)) for w, c in zip(widths, r, strict=True)]
        line = "  ".join(h.ljust(w) for h, w in zip(self.headers, widths, strict=True))
        out = [self.title, line, "-" * len(line)]
        out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in self.rows]
        if self.note:
            out.append(self.note)
        return "\n".join(out)


@dataclass
class Result:
    name: str
    title: str
    goal: str
    tables: list[Table] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    #: "met", "missed" or "n/a".
    verdict: str = "n/a"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "goal": self.goal,
            "verdict": self.verdict,
            "findings": self.findings,
            "tables": [
                {"title": t.title, "headers": t.headers, "rows": t.rows, "note": t.note}
                for t in self.tables
            ],
            "data": self.data,
        }


@dataclass
class Context:
    quick: bool
    work: Path
    #: Launch-tag prefixes of everything started; ``cleanup`` ends what is left of them.
    tags: set[str] = field(default_factory=set)
    #: One repetition of everything (``--smoke``, scripts/test.sh): that it runs, no figure.
    smoke: bool = False

    def reps(self, full: int, quick: int) -> int:
        if self.smoke:
            return 1
        return quick if self.quick else full

    def new_tag(self, what: str) -> str:
        prefix = f"{BENCH_TAG_PREFIX}-{what}-{uuid.uuid4().hex[:8]}"
        self.tags.add(prefix)
        return prefix

    def subdir(self, name: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.work))
        return path


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --- processes ----------------------------------------------------------------------------


def truly_gone(pid: int) -> bool:
    """No /proc entry, or a zombie whose last thread has exited (nothing left to free)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[0]
        return state in (b"Z", b"X") and len(os.listdir(f"/proc/{pid}/task")) <= 1
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants now."""
    try:
        p = psutil.Process(pid)
        return [pid, *(c.pid for c in p.children(recursive=True))]
    except psutil.Error:
        return []


def wait_gone(pids: Iterable[int], timeout_s: float, poll_s: float = 0.001) -> float | None:
    """Monotonic time at which every pid had truly exited, or None after ``timeout_s``."""
    pending = set(pids)
    deadline = time.monotonic() + timeout_s
    while pending:
        pending = {p for p in pending if not truly_gone(p)}
        if not pending:
            break
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)
    return time.monotonic()


def reap(pids: Iterable[int]) -> None:
    """Collect the exit status of any of ``pids`` that are our (or our subreaped) children."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def tagged_alive(prefix: str) -> list[int]:
    """Live (non-zombie) pids whose environment carries a launch tag starting ``prefix``."""
    needle = f"{TAG_ENV}={prefix}".encode()
    out = []
    for pid in psutil.pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if any(item.startswith(needle) for item in env.split(b"\0")) and not truly_gone(pid):
            out.append(pid)
    return out


def kill_tagged(prefix: str) -> list[int]:
    """SIGKILL every live process tagged ``prefix``; reap; return the pids that were alive."""
    pids = tagged_alive(prefix)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    wait_gone(pids, 10.0, 0.01)
    reap(pids)
    return pids


# --- the simulated server -----------------------------------------------------------------


#: How long the simulated ``/health_generate`` takes in the benchmarks (the daemons'
#: default in ``tests.helpers.Daemon``): bare servers get the same, so the comparison is fair.
SIM_HEALTH_S = 0.05


@dataclass
class SimHost:
    """A simulated-GPU registry of its own, and the probe over it."""

    registry: Path
    gpus: int = 8

    def __post_init__(self) -> None:
        prepare_registry(self.registry)
        self.probe = SimGpuProbe(self.registry, count=self.gpus, memory_total_mib=SIM_MEMORY_MIB)

    def used_bytes(self) -> int:
        return sum(s.memory_used_bytes for s in self.probe.sample(list(range(self.gpus))))

    def env(
        self, *, startup_s: float = 0.0, faults: str = "", tag: str | None = None
    ) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != TAG_ENV}
        env.update(
            {
                "SGLANG_SIM_GPU_DIR": str(self.registry),
                "SGLANG_SIM_GPU_MEMORY_MIB": str(SIM_MEMORY_MIB),
                "SGLANG_SIM_STARTUP_S": str(startup_s),
                # As the daemons' simulated servers (tests.helpers.Daemon): the simulated
                # /health_generate otherwise takes SGLang's ~1 s, longer than the probes'
                # timeouts here, and a bare server never read as ready.
                "SGLANG_SIM_HEALTH_S": str(SIM_HEALTH_S),
                "SGLANG_SIM_FAULTS": faults,
                "CUDA_VISIBLE_DEVICES": ",".join(sim_gpu_uuid(i) for i in range(self.gpus)),
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            }
        )
        if tag is not None:
            env[TAG_ENV] = tag
        return env


def sim_argv(port: int, tp: int = 8, mem_fraction: float = 0.85) -> list[str]:
    """The simulated server's command line, as the daemon renders it (levers + owned flags)."""
    return [
        sys.executable,
        "-m",
        "sglang_supervisor.sim.server",
        "--model-path",
        "sim/llama",
        "--tp-size",
        str(tp),
        "--mem-fraction-static",
        str(mem_fraction),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-metrics",
    ]


def wait_http_ok(url: str, timeout_s: float, poll_s: float = 0.002) -> float:
    """Poll ``url`` until it answers 200; the monotonic time it first did. Raises on timeout."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(trust_env=False) as client:
        while True:
            try:
                if client.get(url, timeout=1.0).status_code == 200:
                    return time.monotonic()
            except httpx.HTTPError:
                pass
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{url} did not answer 200 within {timeout_s}s")
            time.sleep(poll_s)


@contextlib.contextmanager
def bare_server(
    host: SimHost, port: int, *, log: Path, tp: int = 8, startup_s: float = 0.0, tag: str
) -> Iterator[subprocess.Popen[bytes]]:
    """The simulated server started by a plain Popen in a new session (no supervisor)."""
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            sim_argv(port, tp),
            env=host.env(startup_s=startup_s, tag=tag),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield popen
    finally:
        pids = tree_pids(popen.pid)
        with contextlib.suppress(OSError):
            os.killpg(popen.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        popen.wait(10)
        wait_gone(pids, 10.0, 0.01)
        reap(pids)


def new_daemon(
    ctx: Context,
    name: str,
    *,
    gpus: int = 8,
    timeouts: dict[str, Any] | None = None,
    sim: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    levers: dict[str, Any] | None = None,
) -> Daemon:
    """A real ``sglang-supervisor serve --simulate`` on loopback with production timeouts."""
    d = Daemon(
        ctx.subdir(name),
        gpus=gpus,
        levers=levers or {"model_path": "sim/llama", "tp_size": gpus, "mem_fraction_static": 0.85},
        timeouts={**DEFAULT_TIMEOUTS, **(timeouts or {})},
        sim={"startup_s": 0.0, **(sim or {})},
        extra={"server": {"env": env}} if env else None,
    )
    ctx.tags.add(d.instance + ".")
    return d


@contextlib.contextmanager
def running(d: Daemon, wait_ready: bool = True, timeout_s: float = 60) -> Iterator[Daemon]:
    """Start the daemon; on exit SIGTERM it (it stops its server) and close its client."""
    try:
        d.start(wait_ready=False)
        if wait_ready:
            d.wait_state("ready", timeout=timeout_s)
        yield d
    finally:
        with contextlib.suppress(Exception):
            d.stop(timeout=90)
        d.client.close()


def op_phases(op: dict[str, Any]) -> dict[str, float]:
    """``{phase name: duration_s}`` of an operation's JSON (a repeated name is summed)."""
    out: dict[str, float] = {}
    for ph in op.get("phases", []):
        if ph.get("duration_s") is not None:
            out[ph["name"]] = out.get(ph["name"], 0.0) + float(ph["duration_s"])
    return out


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    value = fn()
    return time.perf_counter() - t, value
