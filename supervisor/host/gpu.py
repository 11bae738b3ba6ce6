"""GPU probing and release verification.

``GpuProbe`` is the small interface everything GPU-related goes through: NVML on a real
host (``sglang_supervisor.host.nvml.NvmlProbe``), simulated GPUs in ``--simulate`` mode
(``sglang_supervisor.sim.gpus.SimGpuProbe``), fakes in unit tests. A failed query raises
``GpuQueryError``; it is never read as "zero bytes used".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol


class GpuQueryError(RuntimeError):
    """A GPU query failed; the caller must not treat the GPU as empty."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    #: CUDA compute capability (major, minor) from NVML; None when it is not known.
    capability: tuple[int, int] | None = None
    #: The NVIDIA driver's version from NVML (e.g. "580.95.05"); None when not known.
    driver_version: str | None = None


class GpuProcess(NamedTuple):
    pid: int
    #: None when the driver does not report per-process memory.
    used_bytes: int | None


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    uuid: str
    name: str
    memory_used_bytes: int
    memory_total_bytes: int
    processes: tuple[GpuProcess, ...]
    #: The Slurm node the GPU is on, for a server spanning nodes (None: this host).
    node: str | None = None
    #: How old the sample is when it is a node's last one rather than taken now
    #: (``sglang_supervisor.slurm.probe``: ``/status`` never waits on a node); None: now.
    age_s: float | None = None


class GpuProbe(Protocol):
    #: "nvml" or "simulated": shown in /status.
    kind: str

    def devices(self) -> list[GpuInfo]:
        """Every GPU the probe can see, in its own (NVML / PCI bus) index order."""
        ...

    def sample(self, indices: Sequence[int]) -> list[GpuSample]:
        """Memory used and compute processes of each GPU in ``indices``.

        Raises ``GpuQueryError`` when any query fails.
        """
        ...

    def pids_are_local(self) -> bool:
        """Whether the pids the probe reports are in this process's PID namespace.

        False inside a container without the host's PID namespace: then membership
        by pid is impossible and only the memory criterion decides release.
        """
        ...

    def close(self) -> None: ...


def cuda_visible_devices(gpus: Sequence[GpuInfo]) -> tuple[str, dict[str, str]]:
    """The ``CUDA_VISIBLE_DEVICES`` value naming ``gpus`` by UUID, and the env to pass.

    CUDA's default device order is "fastest first", not NVML's PCI bus order, so NVML
    indices must not be passed as CUDA indices. UUIDs name the same GPUs in both;
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` also makes any index-based tool inside the server
    agree with NVML. Raises ``ValueError`` when ``gpus`` is empty (an empty
    ``CUDA_VISIBLE_DEVICES`` would hide every GPU from the server).
    """
    if not gpus:
        raise ValueError("no managed GPUs: set server.gpus to the NVML indices or UUIDs to use")
    value = ",".join(g.uuid for g in gpus)
    return value, {"CUDA_VISIBLE_DEVICES": value, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def resolve_gpus(probe: GpuProbe, names: Sequence[str]) -> list[GpuInfo]:
    """Map configured GPU names (NVML index or UUID) to the probe's devices.

    Raises ``ValueError`` naming the GPU when one does not exist.
    """
    devices = probe.devices()
    by_index = {str(d.index): d for d in devices}
    by_uuid = {d.uuid.lower(): d for d in devices}
    out: list[GpuInfo] = []
    for name in names:
        key = name.strip()
        found = by_index.get(key) or by_uuid.get(key.lower())
        if found is None:
            seen = ", ".join(f"{d.index}={d.uuid}" for d in devices) or "none"
            raise ValueError(
                f"managed GPU {name!r} does not exist (the probe sees: {seen}); "
                "fix server.gpus in the config"
            )
        if found in out:
            raise ValueError(f"managed GPU {name!r} is listed twice; fix server.gpus")
        out.append(found)
    return out


@dataclass
class GpuReleaseState:
    index: int
    memory_used_bytes: int
    baseline_bytes: int
    member_pids: list[int]
    foreign_pids: list[int]
    released: bool


@dataclass
class ReleaseResult:
    released: bool
    elapsed_s: float
    samples: int
    gpus: list[GpuReleaseState] = field(default_factory=list)
    #: The last query error, if the probe failed along the way.
    error: str | None = None
    #: Clean samples in a row at the end, and how many were required.
    streak: int = 0
    required: int = 1
    #: Ended early: no member left, every byte above baseline held by these foreign
    #: pids (waiting would not change that: they are never killed automatically).
    blocked_by: list[int] = field(default_factory=list)

    def describe(self) -> str:
        if self.released:
            return f"all {len(self.gpus)} GPUs released in {self.elapsed_s:.2f}s"
        held = [g for g in self.gpus if not g.released]
        parts = []
        for g in held:
            extra = g.memory_used_bytes - g.baseline_bytes
            who = f", member pids {g.member_pids}" if g.member_pids else ""
            parts.append(f"GPU {g.index}: {extra / 2**20:.0f} MiB above baseline{who}")
        if parts:
            why = "; ".join(parts)
        elif self.streak:
            why = f"clean for only {self.streak} of the {self.required} samples required"
        else:
            why = self.error or "no sample succeeded"
        if self.blocked_by:
            return (
                f"GPUs not released after {self.elapsed_s:.1f}s: {why}; no member of ours "
                f"is left, and what is held above baseline belongs to pids {self.blocked_by}; "
                f"{FOREIGN_ADVICE}"
            )
        return f"GPUs not released after {self.elapsed_s:.1f}s: {why}"


#: What an operator can do about a process that is not ours on a managed GPU.
FOREIGN_ADVICE = (
    "a process that is not ours is never killed automatically: stop it, or take its GPU "
    "out of server.gpus"
)


def foreign_holders(samples: Sequence[GpuSample], members: Collection[int]) -> list[str]:
    """The one rule of what is foreign: every process on a sampled GPU whose pid is not a
    member of our server, as ``pid P holds 10.0 GiB on GPU i``. Only meaningful with
    local pids (the caller checks ``pids_are_local``)."""
    return [
        f"pid {p.pid} holds "
        + ("an unknown amount" if p.used_bytes is None else f"{p.used_bytes / 2**30:.1f} GiB")
        + f" on GPU {s.index}"
        + (f" (node {s.node})" if s.node else "")
        for s in samples
        for p in s.processes
        if p.pid not in members
    ]


#: How long memory may lag behind its process's exit before foreign pids are blamed.
FOREIGN_SETTLE_S = 1.0


def wait_released(
    probe: GpuProbe,
    indices: Sequence[int],
    baseline_bytes: dict[int, int],
    members: Callable[[], Collection[int]],
    *,
    timeout_s: float,
    tolerance_bytes: int,
    consecutive: int = 3,
    interval_s: float = 0.05,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_sample: Callable[[list[GpuSample]], None] | None = None,
) -> ReleaseResult:
    """Block until every GPU in ``indices`` is released, or ``timeout_s`` passes.

    A GPU is released when no pid of ``members()`` is in its process list and its used
    memory is at most ``baseline + tolerance``, for ``consecutive`` samples in a row. A
    failed query resets the count (it is never "zero"). When, for ``consecutive`` samples
    in a row (and ``FOREIGN_SETTLE_S``), no member is on any GPU and every byte above
    baseline is held by named foreign pids, it fails then (``blocked_by``) instead of
    waiting out ``timeout_s``.
    Blocking: run it in a thread.
    """
    start = clock()
    deadline = start + timeout_s
    streak = 0
    blocked = 0  # samples in a row that only foreign pids hold memory above baseline
    n = 0
    last: list[GpuReleaseState] = []
    error: str | None = None
    while True:
        n += 1
        try:
            samples = probe.sample(indices)
        except GpuQueryError as exc:
            error = str(exc)
            streak = 0
            blocked = 0
        else:
            if on_sample is not None:
                on_sample(samples)
            member_set = set(members()) if probe.pids_are_local() else set()
            last = []
            foreign_excess = probe.pids_are_local()
            for s in samples:
                pids = [p.pid for p in s.processes]
                mine = sorted(p for p in pids if p in member_set)
                base = baseline_bytes[s.index]  # measured for every managed GPU, never 0
                ok = not mine and s.memory_used_bytes <= base + tolerance_bytes
                if not ok:
                    # Held above baseline with no member of ours on it: is every such
                    # byte accounted for by named foreign processes?
                    excess = s.memory_used_bytes - base - tolerance_bytes
                    theirs = [p.used_bytes for p in s.processes if p.pid not in member_set]
                    foreign_excess = foreign_excess and not mine and bool(theirs)
                    foreign_excess = foreign_excess and None not in theirs
                    foreign_excess = foreign_excess and sum(b or 0 for b in theirs) >= excess
                last.append(
                    GpuReleaseState(
                        index=s.index,
                        memory_used_bytes=s.memory_used_bytes,
                        baseline_bytes=base,
                        member_pids=mine,
                        foreign_pids=sorted(p for p in pids if p not in member_set),
                        released=ok,
                    )
                )
            streak = streak + 1 if all(g.released for g in last) else 0
            stuck = streak == 0 and foreign_excess
            blocked = blocked + 1 if stuck else 0
        now = clock()
        if streak >= consecutive:
            return ReleaseResult(True, now - start, n, last, error, streak, consecutive)
        if blocked >= consecutive and now - start >= min(timeout_s, FOREIGN_SETTLE_S):
            foreign = sorted({p for g in last if not g.released for p in g.foreign_pids})
            return ReleaseResult(False, now - start, n, last, error, 0, consecutive, foreign)
        if now >= deadline:
            return ReleaseResult(False, now - start, n, last, error, streak, consecutive)
        sleep(min(interval_s, max(0.0, deadline - now)))


def latest_samples(probe: GpuProbe, indices: Sequence[int]) -> list[GpuSample]:
    """``indices`` now (blocking); from a probe that keeps its nodes' last samples
    (``recent``: the Slurm launcher's), those, so that a reader never waits on a node.
    Raises ``GpuQueryError``."""
    recent = getattr(probe, "recent", None)
    if recent is not None:
        got = recent(list(indices))
        if got.errors:
            raise GpuQueryError("; ".join(sorted(set(got.errors.values()))))
        return list(got.samples)
    return probe.sample(list(indices))
