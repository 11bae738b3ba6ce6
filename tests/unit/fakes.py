"""A fake OS, fake GPUs and fake health probes for driving the Supervisor in unit tests.

One ``FakeProbe`` is the GPUs: a GPU's used memory is its baseline plus the bytes of every
pid that holds memory on it. One ``FakeProcessOps`` is the process table: ``spawn`` starts
a launcher and one "rank" per TP rank, and each rank holds memory on its GPU until it is
killed — so a launcher that dies alone leaves its ranks holding memory, as in real life.
``FakeHealth`` answers the readiness/liveness probes for whichever launch is serving.

How each launch misbehaves is scripted with ``Behaviour`` (``procs.plan(...)``).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil

from sglang_supervisor.config import ServerSettings, Settings, TimeoutSettings
from sglang_supervisor.engine import Supervisor
from sglang_supervisor.host.backend import Backend
from sglang_supervisor.host.gpu import GpuInfo, GpuProcess, GpuQueryError, GpuSample
from sglang_supervisor.host.process import describe_exit
from sglang_supervisor.host.teardown import Survivor, TeardownReport
from sglang_supervisor.observe.health import Probe
from sglang_supervisor.sglang.parser import load_schema
from sglang_supervisor.sglang.router import WorkerLink
from sglang_supervisor.sglang.schema import load_bundled
from sglang_supervisor.states import ServerState
from sglang_supervisor.store import Store

MIB = 2**20
GIB = 2**30
#: What the probe adds to every pid when ``local`` is off (a container sees host pids).
HOST_PID_OFFSET = 4_000_000

T = TypeVar("T")


def fake_uuid(index: int) -> str:
    return f"GPU-fa4e0000-0000-4000-8000-{index:012x}"


# ---------------------------------------------------------------------- time


class FakeClock:
    """A monotonic clock that moves only when ``sleep`` is called.

    ``at(t, action)`` runs ``action`` once the clock has reached ``t`` (during a sleep),
    which is how a test says "the rank exits 0.2 s into the wait".
    """

    def __init__(self, start: float = 1000.0) -> None:
        self.start = start
        self.now = start
        self._actions: list[tuple[float, Callable[[], None]]] = []

    def __call__(self) -> float:
        return self.now

    def at(self, offset_s: float, action: Callable[[], None]) -> None:
        self._actions.append((self.start + offset_s, action))
        self._actions.sort(key=lambda a: a[0])

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        while self._actions and self._actions[0][0] <= self.now:
            _, action = self._actions.pop(0)
            action()


async def until(pred: Callable[[], bool], timeout: float = 3.0, what: str = "") -> None:
    """Wait (on the event loop) until ``pred()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or pred}")
        await asyncio.sleep(0.002)


def run(coro_fn: Callable[[], Awaitable[T]], timeout: float = 15.0) -> T:
    """Run one test scenario on a fresh event loop, bounded by ``timeout``."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro_fn(), timeout)

    return asyncio.run(bounded())


# ---------------------------------------------------------------------- GPUs


class FakeProbe:
    """``GpuProbe`` over a dict ``pid -> (gpu index, bytes)`` that the fake OS updates."""

    kind = "simulated"

    def __init__(
        self,
        count: int = 2,
        *,
        memory_total_bytes: int = 80 * GIB,
        baseline_bytes: int = 600 * MIB,
        local: bool = True,
    ) -> None:
        self.lock = threading.RLock()
        self.gpus = [
            GpuInfo(
                index=i, uuid=fake_uuid(i), name="Fake H200", memory_total_bytes=memory_total_bytes
            )
            for i in range(count)
        ]
        self.baseline = {i: baseline_bytes for i in range(count)}
        self.holders: dict[int, tuple[int, int]] = {}
        self.local = local
        self.closed = False
        self.samples_taken = 0
        #: Called with the sample number (1-based) before each sample is computed.
        self.before_sample: Callable[[int], None] | None = None
        self._fail_next = 0
        self._fail_message = "NVML: Unknown Error"

    # -- what the fake OS and the tests do

    def hold(self, pid: int, gpu: int, nbytes: int) -> None:
        with self.lock:
            self.holders[pid] = (gpu, nbytes)

    def free(self, pid: int) -> None:
        with self.lock:
            self.holders.pop(pid, None)

    def fail(self, samples: int, message: str = "NVML: Unknown Error") -> None:
        """The next ``samples`` calls to ``sample`` raise ``GpuQueryError``."""
        with self.lock:
            self._fail_next += samples
            self._fail_message = message

    def used(self, index: int) -> int:
        with self.lock:
            held = sum(b for g, b in self.holders.values() if g == index)
            return self.baseline[index] + held

    def above_baseline(self) -> dict[int, int]:
        """Bytes above baseline per GPU: what a user would see as "still held"."""
        return {g.index: self.used(g.index) - self.baseline[g.index] for g in self.gpus}

    def uuid_index(self, uuid: str) -> int:
        return next(g.index for g in self.gpus if g.uuid == uuid)

    # -- GpuProbe

    def devices(self) -> list[GpuInfo]:
        return list(self.gpus)

    def sample(self, indices: Sequence[int]) -> list[GpuSample]:
        with self.lock:
            self.samples_taken += 1
            if self.before_sample is not None:
                self.before_sample(self.samples_taken)
            if self._fail_next > 0:
                self._fail_next -= 1
                raise GpuQueryError(self._fail_message)
            out = []
            for index in indices:
                if not 0 <= index < len(self.gpus):
                    raise GpuQueryError(f"GPU {index} does not exist")
                info = self.gpus[index]
                shift = 0 if self.local else HOST_PID_OFFSET
                procs = tuple(
                    GpuProcess(pid + shift, nbytes)
                    for pid, (g, nbytes) in sorted(self.holders.items())
                    if g == index
                )
                out.append(
                    GpuSample(
                        index=index,
                        uuid=info.uuid,
                        name=info.name,
                        memory_used_bytes=self.used(index),
                        memory_total_bytes=info.memory_total_bytes,
                        processes=procs,
                    )
                )
            return out

    def pids_are_local(self) -> bool:
        return self.local

    def close(self) -> None:
        self.closed = True


# ----------------------------------------------------------------- processes


@dataclass
class Behaviour:
    """How one launch behaves. The default: healthy, ready at the first probe."""

    #: The launcher exits with this code right after spawn (the ranks never load).
    exit_on_start: int | None = None
    #: /health_generate never answers 200.
    never_ready: bool = False
    #: Probes needed before /health_generate answers 200.
    ready_after: int = 1
    #: Not ready while the test holds it (``handle.held = False`` lets it go).
    hold_ready: bool = False
    #: The launcher dies with SIGSEGV this long after it first answered ready (ranks too).
    crash_after_ready_s: float | None = None
    #: Every member ignores SIGTERM; teardown needs SIGKILL.
    ignore_sigterm: bool = False
    #: The ranks are stuck in the driver (D state): they survive SIGKILL and keep memory.
    unkillable: bool = False
    #: False: its bind of the server port fails (it listens nowhere; another process
    #: on the port may answer /health_generate for it).
    binds: bool = True
    #: Frozen (SIGSTOP) once it has answered ready: every later probe hangs for its
    #: whole timeout, then fails.
    freeze_after_ready: bool = False
    #: Lines the server writes to its log.
    log_lines: list[str] = field(default_factory=list)
    max_total_num_tokens: int = 400_000


@dataclass
class FakeProc:
    pid: int
    tag: str
    launch: FakeHandle
    role: str
    alive: bool = True


@dataclass(eq=False)
class FakeHandle:
    """``ServerHandle`` of a fake launch."""

    pid: int
    create_time: float
    tag: str
    log_path: Path
    behaviour: Behaviour
    ops: FakeProcessOps = field(repr=False)
    rank_pids: list[int] = field(default_factory=list)
    returncode: int | None = None
    probes: int = 0
    ready_at: float | None = None
    #: /health_generate times out (a hung server) while set.
    hung: bool = False
    held: bool = False

    def poll(self) -> bool:
        with self.ops.lock:
            b = self.behaviour
            if (
                self.returncode is None
                and b.crash_after_ready_s is not None
                and self.ready_at is not None
                and time.monotonic() - self.ready_at >= b.crash_after_ready_s
            ):
                self.ops.crash(self, returncode=-11)
            return self.returncode is not None

    def describe_exit(self) -> str:
        return describe_exit(self.returncode)


@dataclass
class SpawnRecord:
    argv: list[str]
    env: dict[str, str]
    tag: str
    log_path: Path
    handle: FakeHandle
    #: Bytes above baseline on each GPU at the moment of the spawn.
    gpu_held_at_spawn: dict[int, int]


def _flag_value(argv: Sequence[str], option: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == option and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(option + "="):
            return arg.split("=", 1)[1]
    return None


class FakeProcessOps:
    """``ProcessOps`` over a fake process table; ranks hold memory on the ``FakeProbe``."""

    def __init__(self, probe: FakeProbe, *, first_pid: int = 41_000) -> None:
        self.probe = probe
        self.lock = probe.lock
        self._pids = itertools.count(first_pid)
        self.procs: dict[int, FakeProc] = {}
        self.spawns: list[SpawnRecord] = []
        self.teardowns: list[TeardownReport] = []
        self.default = Behaviour()
        self._plan: deque[Behaviour] = deque()
        self._when: list[tuple[str, str, Behaviour]] = []
        #: Raised by the next spawn (the program cannot be executed).
        self.spawn_error: Exception | None = None
        #: While set, spawn and teardown wait until the test sets the event (a slow
        #: exec, a slow SIGTERM grace): the step is in progress in its worker thread.
        self.spawn_gate: threading.Event | None = None
        self.teardown_gate: threading.Event | None = None
        #: Teardowns running now, and the most that ever ran at once.
        self.teardowns_running = 0
        self.max_concurrent_teardowns = 0
        #: Spawns that have entered ``spawn`` (whether or not they have returned).
        self.spawns_begun = 0
        #: Processes not ours listening on the server port (None: one we cannot see).
        self.port_squatters: list[int | None] = []

    def when(self, option: str, value: str, behaviour: Behaviour) -> None:
        """A launch whose ``option`` is ``value`` behaves so (unless planned otherwise)."""
        self._when.append((option, value, behaviour))

    def _by_flags(self, argv: Sequence[str]) -> Behaviour:
        for option, value, behaviour in self._when:
            if _flag_value(argv, option) == value:
                return behaviour
        return self.default

    def plan(self, *behaviours: Behaviour) -> None:
        """The next launches behave like this, in order; later ones like ``default``."""
        self._plan.extend(behaviours)

    # -- what tests look at

    @property
    def handles(self) -> list[FakeHandle]:
        return [s.handle for s in self.spawns]

    def current(self) -> FakeHandle | None:
        """The newest launch whose launcher is still running."""
        with self.lock:
            for record in reversed(self.spawns):
                if not record.handle.poll():
                    return record.handle
            return None

    def alive_pids(self) -> set[int]:
        with self.lock:
            return {p.pid for p in self.procs.values() if p.alive}

    # -- what the tests do to the server

    def crash(
        self, handle: FakeHandle, *, returncode: int = -9, orphan_ranks: bool = False
    ) -> None:
        """The launcher dies (and its ranks too, unless ``orphan_ranks``)."""
        with self.lock:
            if handle.returncode is None:
                handle.returncode = returncode
            self._kill(handle.pid)
            if not orphan_ranks:
                for pid in handle.rank_pids:
                    self._kill(pid)

    def release_stuck(self) -> None:
        """The driver finally lets the stuck (D-state) ranks exit."""
        with self.lock:
            for proc in self.procs.values():
                if proc.alive and self._stuck(proc):
                    self._kill(proc.pid)

    def _kill(self, pid: int) -> None:
        proc = self.procs.get(pid)
        if proc is not None and proc.alive:
            proc.alive = False
            self.probe.free(pid)

    # -- ProcessOps

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], *, tag: str, log_path: Path
    ) -> FakeHandle:
        with self.lock:
            self.spawns_begun += 1
        gate = self.spawn_gate
        if gate is not None and not gate.wait(10):
            raise AssertionError("the test never opened spawn_gate")
        with self.lock:
            if self.spawn_error is not None:
                err, self.spawn_error = self.spawn_error, None
                raise err
            behaviour = self._plan.popleft() if self._plan else self._by_flags(argv)
            held = self.probe.above_baseline()
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "a", encoding="utf-8") as f:
                f.write("[fake] server starting\n")
                for line in behaviour.log_lines:
                    f.write(line + "\n")
            handle = FakeHandle(
                pid=next(self._pids),
                create_time=time.time(),
                tag=tag,
                log_path=log_path,
                behaviour=behaviour,
                ops=self,
                held=behaviour.hold_ready,
            )
            self.procs[handle.pid] = FakeProc(handle.pid, tag, handle, "launcher")
            if behaviour.exit_on_start is not None:
                handle.returncode = behaviour.exit_on_start
                self.procs[handle.pid].alive = False
            else:
                self._start_ranks(handle, argv, env)
            self.spawns.append(SpawnRecord(list(argv), dict(env), tag, log_path, handle, held))
            return handle

    def _start_ranks(self, handle: FakeHandle, argv: Sequence[str], env: Mapping[str, str]) -> None:
        tp = int(_flag_value(argv, "--tp-size") or 1)
        fraction = float(_flag_value(argv, "--mem-fraction-static") or 0.8)
        uuids = [u for u in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if u]
        gpus = [self.probe.uuid_index(u) for u in uuids] or [0]
        for rank in range(tp):
            pid = next(self._pids)
            gpu = gpus[rank % len(gpus)]
            total = self.probe.gpus[gpu].memory_total_bytes
            self.procs[pid] = FakeProc(pid, handle.tag, handle, f"rank {rank}")
            handle.rank_pids.append(pid)
            self.probe.hold(pid, gpu, int(fraction * total))

    def _matches(
        self,
        proc: FakeProc,
        handle: object | None,
        tag: str | None,
        tag_prefix: str | None,
        exclude_tag: str | None = None,
    ) -> bool:
        if not proc.alive:
            return False
        if handle is not None and proc.launch is handle:
            return True
        if exclude_tag is not None and proc.tag == exclude_tag:
            return False
        if tag is not None and proc.tag == tag:
            return True
        return tag_prefix is not None and proc.tag.startswith(tag_prefix)

    def members(
        self,
        handle: Any,
        *,
        tag: str | None,
        tag_prefix: str | None,
        exclude_tag: str | None = None,
    ) -> set[int]:
        with self.lock:
            return {
                p.pid
                for p in self.procs.values()
                if self._matches(p, handle, tag, tag_prefix, exclude_tag)
            }

    def port_listeners(self, host: str, port: int) -> list[int | None]:
        """The squatters, then every live launcher that binds and has answered ready."""
        with self.lock:
            ours: list[int | None] = [
                s.handle.pid
                for s in self.spawns
                if s.handle.returncode is None
                and s.handle.behaviour.binds
                and s.handle.ready_at is not None
            ]
            return [*self.port_squatters, *ours]

    def adopt(self, pid: int, create_time: float, tag: str, log_path: Path) -> FakeHandle | None:
        """The launch an earlier daemon started, if that very launcher still runs."""
        with self.lock:
            proc = self.procs.get(pid)
            if proc is None or not proc.alive or proc.role != "launcher":
                return None
            handle = proc.launch
            if abs(handle.create_time - create_time) > 0.05 or handle.tag != tag:
                return None  # the pid was reused
            return handle

    def teardown(
        self,
        handle: Any,
        *,
        tag: str | None,
        tag_prefix: str | None,
        grace_s: float,
        kill_timeout_s: float,
        exclude_tag: str | None = None,
        cut_grace: Callable[[], bool] | None = None,
    ) -> TeardownReport:
        with self.lock:
            self.teardowns_running += 1
            self.max_concurrent_teardowns = max(
                self.max_concurrent_teardowns, self.teardowns_running
            )
        try:
            gate = self.teardown_gate
            if gate is not None and not gate.wait(10):
                raise AssertionError("the test never opened teardown_gate")
            return self._teardown(handle, tag, tag_prefix, grace_s, exclude_tag, cut_grace)
        finally:
            with self.lock:
                self.teardowns_running -= 1

    def _teardown(
        self,
        handle: Any,
        tag: str | None,
        tag_prefix: str | None,
        grace_s: float,
        exclude_tag: str | None,
        cut_grace: Callable[[], bool] | None = None,
    ) -> TeardownReport:
        report = TeardownReport()
        with self.lock:
            targets = [
                p
                for p in self.procs.values()
                if self._matches(p, handle, tag, tag_prefix, exclude_tag)
            ]
            report.members = sorted(p.pid for p in targets)
            report.sigterm_sent = list(report.members)
            for proc in targets:
                if not (proc.launch.behaviour.ignore_sigterm or self._stuck(proc)):
                    self._exit(proc, -15)
            left = [p for p in targets if p.alive]
        waited = 0.0
        if left:  # the grace period runs out (or is cut short); then SIGKILL
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and not (cut_grace is not None and cut_grace()):
                time.sleep(min(0.005, grace_s))
            waited = min(grace_s, grace_s - (deadline - time.monotonic()))
        with self.lock:
            if left:
                report.kill_after_s = waited
            report.sigkill_sent = sorted(p.pid for p in left)
            for proc in left:
                if not self._stuck(proc):
                    self._exit(proc, -9)
            for proc in targets:
                if proc.alive:
                    report.survivors.append(
                        Survivor(proc.pid, psutil.STATUS_DISK_SLEEP, f"fake sglang {proc.role}")
                    )
            if not report.survivors:
                report.exit_s = waited if left else 0.01
            self.teardowns.append(report)
            return report

    @staticmethod
    def _stuck(proc: FakeProc) -> bool:
        """Unkillable ranks: stuck in the driver, they survive even SIGKILL."""
        return proc.launch.behaviour.unkillable and proc.role != "launcher"

    def _exit(self, proc: FakeProc, returncode: int) -> None:
        if proc.role == "launcher" and proc.launch.returncode is None:
            proc.launch.returncode = returncode
        self._kill(proc.pid)


# -------------------------------------------------------------------- health

DEFAULT_METRICS = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="fake"} 0.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="fake"} 0.0
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="fake"} 850.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="fake"} 0.5
"""


class FakeHealth:
    """``HealthChecker`` whose answers follow the fake launch that is currently serving."""

    def __init__(self, procs: FakeProcessOps) -> None:
        self.procs = procs
        self.metrics: str | None = DEFAULT_METRICS
        self.closed = False

    async def generate_ok(self, url: str, timeout_s: float) -> Probe:
        await asyncio.sleep(0)
        handle = self.procs.current()
        if handle is None:
            return Probe(False, f"GET {url}/health_generate failed: ConnectError")
        with self.procs.lock:
            frozen = handle.behaviour.freeze_after_ready and handle.ready_at is not None
        if frozen:
            await asyncio.sleep(timeout_s)  # a stopped process never answers
            return Probe(False, f"GET {url}/health_generate timed out after {timeout_s}s")
        with self.procs.lock:
            handle.probes += 1
            b = handle.behaviour
            if handle.hung:
                return Probe(False, f"GET {url}/health_generate timed out after {timeout_s}s")
            if b.never_ready or handle.held or handle.probes < b.ready_after:
                return Probe(False, f"GET {url}/health_generate answered 503")
            if handle.ready_at is None:
                handle.ready_at = time.monotonic()
            return Probe(True, "200")

    async def server_info(
        self, url: str, timeout_s: float, headers: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        handle = self.procs.current()
        if handle is None:
            raise ConnectionError(f"{url} does not answer")
        return {"max_total_num_tokens": handle.behaviour.max_total_num_tokens}

    async def metrics_text(self, url: str, timeout_s: float) -> str | None:
        return self.metrics if self.procs.current() is not None else None

    async def aclose(self) -> None:
        self.closed = True


# ---------------------------------------------------------------------- rig

#: The levers every rig starts with (unless told otherwise): a 2-GPU TP server.
INITIAL_LEVERS: dict[str, Any] = {
    "model_path": "fake-org/fake-model",
    "tp_size": 2,
    "mem_fraction_static": 0.8,
}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fast_timeouts(**overrides: Any) -> TimeoutSettings:
    values: dict[str, Any] = {
        "stop_grace_s": 0.05,
        "kill_timeout_s": 0.1,
        "ready_timeout_s": 0.5,
        "probation_s": 0.05,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.02,
        "liveness_interval_s": 0.02,
        "liveness_timeout_s": 0.05,
        "liveness_failures": 2,
        "crash_loop_count": 3,
        "release_timeout_s": 0.3,
        "release_samples": 1,
    }
    values.update(overrides)
    return TimeoutSettings(**values)


def make_settings(
    state_dir: Path,
    *,
    levers: Mapping[str, Any] | None = None,
    gpus: Sequence[str] = (),
    port: int | None = None,
    python: str | None = None,
    **timeouts: Any,
) -> Settings:
    return Settings(
        simulate=True,
        state_dir=state_dir,
        instance="unit-test",
        server=ServerSettings(
            **({} if python is None else {"python": python}),
            port=port or free_port(),
            gpus=list(gpus),
            levers=dict(INITIAL_LEVERS if levers is None else levers),
        ),
        timeouts=fast_timeouts(**timeouts),
    )


@dataclass
class Rig:
    """One Supervisor on fake GPUs, a fake process table and fake health probes."""

    sup: Supervisor
    probe: FakeProbe
    procs: FakeProcessOps
    health: FakeHealth
    settings: Settings

    async def start_ready(self, timeout: float = 10.0) -> None:
        """``start()`` and wait until the initial start operation has finished ready."""
        await self.sup.start()
        op = self.sup.operation
        assert op is not None
        await asyncio.wait_for(op.done.wait(), timeout)
        await until(lambda: self.sup.operation is None, timeout, "the start operation to clear")
        assert self.sup.state == ServerState.READY, self.sup.state_reason

    def transitions(self) -> list[tuple[str, str]]:
        return [(e["old"], e["new"]) for e in self.sup.events.recent() if e["kind"] == "transition"]


def make_rig(
    state_dir: Path,
    *,
    probe: FakeProbe | None = None,
    procs: FakeProcessOps | None = None,
    settings: Settings | None = None,
    backend_name: str = "simulated",
    clock: Callable[[], float] = time.monotonic,
    health: FakeHealth | None = None,
    router: WorkerLink | None = None,
    **settings_kw: Any,
) -> Rig:
    """A Supervisor wired to fakes; pass ``probe``/``procs`` to share one fake host, and
    a ``FakeClock`` to decide when the liveness probes and backoffs are due. ``health``
    (built on ``procs``) and ``router`` replace the fake probes and the absent router."""
    probe = probe or (procs.probe if procs is not None else FakeProbe())
    procs = procs or FakeProcessOps(probe)
    health = health or FakeHealth(procs)
    settings = settings or make_settings(state_dir, **settings_kw)
    sup = Supervisor(
        settings,
        backend=Backend(
            name=backend_name,
            command=["fake-sglang"],
            probe=probe,
            simulated_host_ram_bytes=2048 * GIB,
        ),
        procs=procs,
        health=health,
        schema=load_bundled(),
        # The live schema is read only when a test names an interpreter.
        schema_loader=load_schema if "python" in settings_kw else None,
        store=Store(state_dir),
        poll_s=0.005,
        clock=clock,
        router=router,
    )
    return Rig(sup, probe, procs, health, settings)
