"""The simulated server's child processes: one ``sglang_supervisor.sim.rank`` per rank (each holds
its GPU memory in the simulated-GPU registry) plus a detokenizer, as SGLang's launcher
spawns its schedulers and detokenizer."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sglang_supervisor.sim.faults import Faults
from sglang_supervisor.sim.flags import log

#: How long the ranks may take to start and register their memory.
REGISTER_TIMEOUT_S = 30.0


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"#{signum}"


class ServerFailure(Exception):
    """The server cannot start or go on (OOM, a fault, a dead child); ``lines`` say why."""

    def __init__(self, lines: list[str], who: str = "") -> None:
        super().__init__(lines[-1] if lines else "start-up failed")
        self.lines = lines
        self.who = who


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]


@dataclass
class Children:
    """The ranks and the detokenizer of one launcher."""

    registry: Path
    faults: Faults
    all: list[Child] = field(default_factory=list)
    ranks: list[Child] = field(default_factory=list)

    def _argv(self, extra: Sequence[str]) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "sglang_supervisor.sim.rank",
            "--registry",
            str(self.registry),
        ]
        if self.faults.ignore_sigterm:
            argv.append("--ignore-sigterm")
        if self.faults.detach_ranks:
            argv.append("--setsid")
        return [*argv, *extra]

    def spawn(self, gpus: Sequence[str], rank_bytes: int, unpin_s: float = 0.0) -> None:
        """One child per rank (on ``gpus[r]``), plus the detokenizer; they inherit env,
        stdout and process group; each rank's memory stays held ``unpin_s`` past its
        SIGTERM (the host pool's unpinning). ``ServerFailure`` if one cannot be started."""
        self.registry.mkdir(parents=True, exist_ok=True)
        plan: list[tuple[str, list[str]]] = [
            (
                f"TP{r}",
                [
                    *("--rank", str(r), "--gpu-uuid", gpu, "--bytes", str(rank_bytes)),
                    *("--unpin-s", f"{unpin_s:.3f}"),
                ],
            )
            for r, gpu in enumerate(gpus)
        ]
        plan.append(("detokenizer", ["--detokenizer"]))
        for name, extra in plan:
            try:
                popen = subprocess.Popen(self._argv(extra), stdin=subprocess.DEVNULL)
            except OSError as exc:
                raise ServerFailure([f"RuntimeError: cannot start {name}: {exc}"]) from exc
            child = Child(name, popen)
            self.all.append(child)
            if name != "detokenizer":
                self.ranks.append(child)

    def wait_registered(self, wait: Callable[[float], bool]) -> bool:
        """Wait for every rank's registry entry, doing ``wait(until)`` between looks.
        True when ``wait`` reported a stop signal first."""
        deadline = time.monotonic() + REGISTER_TIMEOUT_S
        pending = list(self.ranks)
        while pending:
            pending = [c for c in pending if not (self.registry / f"{c.popen.pid}.json").exists()]
            if not pending:
                break
            if time.monotonic() >= deadline:
                names = ", ".join(f"{c.name} (pid {c.popen.pid})" for c in pending)
                raise ServerFailure(
                    [f"RuntimeError: ranks did not start within {REGISTER_TIMEOUT_S:.0f}s: {names}"]
                )
            if wait(time.monotonic() + 0.02):
                return True
        return False

    def check_alive(self) -> None:
        """``ServerFailure`` naming the first child that exited."""
        for child in self.all:
            rc = child.popen.poll()
            if rc is not None:
                how = f"exit code {rc}" if rc >= 0 else f"signal {signal_name(-rc)}"
                raise ServerFailure(
                    [
                        f"{child.name} (pid {child.popen.pid}) exited unexpectedly "
                        f"({how}); killing the server's processes"
                    ]
                )

    def stop(self, grace_s: float) -> None:
        """SIGTERM every child (none when ``grace_s`` is 0), wait up to ``grace_s``, then
        SIGKILL the stragglers and reap them all."""
        if grace_s > 0:
            for child in self.all:
                child.popen.send_signal(signal.SIGTERM)  # no-op once reaped
            deadline = time.monotonic() + grace_s
            for child in self.all:
                try:
                    child.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log(
                        f"{child.name} (pid {child.popen.pid}) ignored SIGTERM for "
                        f"{grace_s:.0f}s; sending SIGKILL"
                    )
        for child in self.all:
            child.popen.kill()  # no-op once reaped
        for child in self.all:
            try:
                child.popen.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                log(
                    f"{child.name} (pid {child.popen.pid}) survived SIGKILL for 10s "
                    "(D-state?); leaving it"
                )
