"""The per-node presence's task: ``python -m sglang_supervisor.slurm.agent [options]``, one
task per node of ONE long-lived ``srun --overlap`` step for the allocation's life
(``sglang_supervisor.slurm.presence`` starts it and talks to it).

Slurm launches, tracks and signals it; it talks over Slurm's own I/O forwarding (srun's
stdin reaches every task, every task's stdout comes back labelled), so a question to the
nodes creates no job step:

* every ``--interval`` seconds, and once at its start, it prints a sample of its node:
  ``{"sample": n, "node", "step", "gpus"`` (or ``"gpu_error"``) ``, "procs", "memory"}``, where
  ``procs`` is ``[[pid, tag, status, cpu_s], ...]`` for every process of this instance on
  the node (tagged with ``--tag-prefix``; ``status`` as psutil says it: ``stopped`` for a
  SIGSTOPped one, ``disk-sleep``, ``zombie``...) and ``memory`` the node's RAM;
* each line on stdin is a request ``{"id": n, "nodes": [...], "argv": [...]}``: a node
  named in ``nodes`` answers ``{"id": n, **nodeprobe.answer(argv)}`` at once (the first
  node named is the one ``--signal-leader`` signals), after a fresh sample, so that what
  readers see is never older than the last answer; the others stay silent;
* the end of stdin (the daemon closed it, or died) ends it: nothing of the presence
  outlives its daemon. SIGTERM and SIGINT are ignored: a ``scancel`` of the job signals
  every step, and the daemon's own graceful stop still needs the nodes (the leader's
  signal, the sweep, the release) until Slurm's SIGKILL after ``KillWait``.

The GPU probe (NVML, or the node's simulated GPUs) is opened once for the task's life.
One answer or sample is one JSON line; srun cuts long lines into labelled pieces, which
the presence joins.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import psutil

from sglang_supervisor.host.gpu import GpuProbe, GpuQueryError
from sglang_supervisor.slurm import nodeprobe

#: A request line longer than this is not one of ours: it is dropped.
MAX_REQUEST_BYTES = 64 * 1024


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_supervisor.slurm.agent")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--tag-prefix", required=True, help="this instance's launch tag prefix")
    p.add_argument("--sim-registry")
    p.add_argument("--sim-gpus", type=int, default=8)
    p.add_argument("--sim-mib", type=int, default=143771)
    p.add_argument("--sim-baseline-mib", type=int, default=0)
    return p


def tagged_processes(prefix: str, found: nodeprobe.Scan) -> list[list[Any]]:
    """``[pid, tag, status, cpu_s]`` of this instance's processes in ``found`` (a scan of
    this node's tagged processes)."""
    out: list[list[Any]] = []
    for pid, tag in found:
        if not tag.startswith(prefix):
            continue
        try:
            p = psutil.Process(pid)
            with p.oneshot():
                status = p.status()
                t = p.cpu_times()
        except psutil.Error:
            continue
        out.append([pid, tag, status, round(t.user + t.system, 2)])
    return out


def sample(
    seq: int, probe: GpuProbe, prefix: str, found: nodeprobe.Scan | None = None
) -> dict[str, Any]:
    """One look at this node: GPUs, our processes (from ``found``, else a new scan), RAM."""
    node = nodeprobe.node_name()
    out: dict[str, Any] = {"sample": seq, "node": node, "step": os.environ.get("SLURM_STEP_ID")}
    try:
        out["gpus"] = nodeprobe.gpus_json(probe)
    except GpuQueryError as exc:
        out["gpu_error"] = str(exc)
    out["procs"] = tagged_processes(prefix, nodeprobe.scan(node) if found is None else found)
    mem = psutil.virtual_memory()
    out["memory"] = {"total_bytes": mem.total, "available_bytes": mem.available}
    return out


def respond(
    line: bytes, probe: GpuProbe, base: Sequence[str]
) -> tuple[dict[str, Any], nodeprobe.Scan] | None:
    """The answer to one request line and the scan of this node's processes it was
    answered from (None: not addressed to this node)."""
    try:
        req = json.loads(line)
        rid = int(req["id"])
        nodes = [str(n) for n in req.get("nodes") or []]
        argv = [str(a) for a in req.get("argv") or []]
    except (ValueError, KeyError, TypeError):
        return None  # not one of ours: nobody waits for an answer to it
    node = nodeprobe.node_name()
    if nodes and node not in nodes:
        return None
    # One look at the processes serves the question and the fresh sample before it.
    found = nodeprobe.scan(node)
    try:
        ns = nodeprobe.parser().parse_args([*base, *argv])
    except SystemExit:
        return {"id": rid, "node": node, "error": f"bad request {argv!r}"}, found
    try:
        data = nodeprobe.answer(ns, probe, first=not nodes or nodes[0] == node, found=found)
    except Exception as exc:  # one question failed; the presence goes on
        return {"id": rid, "node": node, "error": f"{type(exc).__name__}: {exc}"}, found
    return {"id": rid, **data}, found


def _emit(data: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def serve(ns: argparse.Namespace) -> int:
    """Sample every ``ns.interval`` and answer every request until stdin ends."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    base = []
    if ns.sim_registry:
        base = [
            "--sim-registry", ns.sim_registry, "--sim-gpus", str(ns.sim_gpus),
            "--sim-mib", str(ns.sim_mib), "--sim-baseline-mib", str(ns.sim_baseline_mib),
        ]  # fmt: skip
    probe = nodeprobe.gpu_probe(nodeprobe.parser().parse_args(base))
    fd = sys.stdin.fileno()
    buffer = b""
    seq = 0
    next_sample = time.monotonic()
    try:
        while True:
            now = time.monotonic()
            if now >= next_sample:
                _emit(sample(seq, probe, ns.tag_prefix))
                seq += 1
                next_sample = now + ns.interval
            ready, _, _ = select.select([fd], [], [], max(0.0, next_sample - time.monotonic()))
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return 0  # stdin ended: the daemon is gone or closed the presence
            buffer += chunk
            while b"\n" in buffer:
                line, _, buffer = buffer.partition(b"\n")
                got = respond(line, probe, base)
                if got is not None:
                    # A fresh sample first: whoever asked then reads a view of the node
                    # at least as new as the answer (the readiness check's, a release's).
                    answer, found = got
                    _emit(sample(seq, probe, ns.tag_prefix, found))
                    seq += 1
                    next_sample = time.monotonic() + ns.interval
                    _emit(answer)
            if len(buffer) > MAX_REQUEST_BYTES:
                buffer = b""
    except BrokenPipeError:
        return 0  # srun is gone: so is the daemon
    finally:
        probe.close()


def main(argv: Sequence[str] | None = None) -> int:
    return serve(_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
