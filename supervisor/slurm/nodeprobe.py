"""The per-node probe: ``python -m sglang_supervisor.slurm.nodeprobe [options]``, run on every
node of the allocation through ``srun --overlap`` (``sglang_supervisor.slurm.probe``).

Prints one JSON line about this node (``SLURMD_NODENAME``):

* ``gpus``: every GPU (NVML, or the node's simulated GPUs with ``--sim-registry``): index,
  uuid, name, memory used and total, and the processes holding memory ``[[pid, bytes]]``;
  ``gpu_error`` instead when the query failed (never read as "free");
* ``members``: the pids carrying our launch tag (``--tag`` exactly, or ``--tag-prefix``,
  less ``--exclude-tag``);
* with ``--signal-leader SIG``, on the request's first node only (the server step's node
  0): the pids of the step's task there (tagged ``--tag``, child of ``slurmstepd``: the
  server's launcher, which ``sglang_supervisor.slurm.task`` execs) that got ``SIG``, under
  ``signalled``;
* with ``--port-holders PORT``: the pids listening on that TCP port, under
  ``port_holders`` (the rendezvous port of ``--dist-init-addr`` on node 0);
* with ``--sweep``: every member of this node SIGKILLed (no grace: only processes left
  behind by an ended step are swept) and waited for, under ``sweep``.

Run by itself it prints one answer and exits 0 whenever it could answer (a tool for an
operator); the daemon asks the same questions of every node through the presence's
long-lived task (``sglang_supervisor.slurm.agent``), which answers with ``answer``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from sglang_supervisor.host.gpu import GpuProbe, GpuQueryError
from sglang_supervisor.host.process import TAG_ENV

_TAG_KEY = TAG_ENV.encode()


def parser() -> argparse.ArgumentParser:
    """The options of one question (the same for a request to the agent)."""
    p = argparse.ArgumentParser(prog="python -m sglang_supervisor.slurm.nodeprobe")
    p.add_argument("--sim-registry", help="base directory of the simulated GPUs' registry")
    p.add_argument("--sim-gpus", type=int, default=8)
    p.add_argument("--sim-mib", type=int, default=143771)
    p.add_argument("--sim-baseline-mib", type=int, default=0)
    p.add_argument("--tag")
    p.add_argument("--tag-prefix")
    p.add_argument("--exclude-tag")
    p.add_argument("--signal-leader", choices=["TERM", "KILL", "INT"])
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--kill-timeout", type=float, default=30.0)
    p.add_argument("--no-gpus", action="store_true", help="skip the GPU query")
    p.add_argument("--port-holders", type=int, help="pids listening on this TCP port")
    return p


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def gpu_probe(ns: argparse.Namespace) -> GpuProbe:
    """This node's simulated GPUs (``<registry>/<node>``), else NVML."""
    if ns.sim_registry:
        from sglang_supervisor.sim.gpus import SimGpuProbe, prepare_registry

        registry = Path(ns.sim_registry) / node_name()
        prepare_registry(registry)
        return SimGpuProbe(registry, ns.sim_gpus, ns.sim_mib, ns.sim_baseline_mib)
    from sglang_supervisor.host.nvml import NvmlProbe

    return NvmlProbe()


def gpus_json(probe: GpuProbe) -> list[dict[str, Any]]:
    devices = probe.devices()
    return [
        {
            "index": s.index,
            "uuid": s.uuid,
            "name": s.name,
            "memory_used_bytes": s.memory_used_bytes,
            "memory_total_bytes": s.memory_total_bytes,
            "processes": [[p.pid, p.used_bytes] for p in s.processes],
        }
        for s in probe.sample([d.index for d in devices])
    ]


#: One look at this node's processes: ``(pid, launch tag)`` of every tagged process of
#: this node (``scan``), shared by a question's sample and its answer.
Scan = list[tuple[int, str]]


def _tag_and_node(pid: int) -> tuple[str | None, str | None]:
    """``TAG_ENV`` and ``SLURMD_NODENAME`` from ``pid``'s environment (one read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None, None
    tag = node = None
    for item in data.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key == _TAG_KEY:
            tag = value.decode(errors="replace")
        elif key == b"SLURMD_NODENAME":
            node = value.decode(errors="replace")
    return tag, node


def scan(node: str | None = None) -> Scan:
    """Every tagged process of this node: one read of each environment, nothing more
    (several ``slurmd`` of a test cluster share one host: a process whose
    ``SLURMD_NODENAME`` is another node's is left out; one with none is this node's)."""
    node = node or node_name()
    me = os.getpid()
    out: Scan = []
    for pid in psutil.pids():
        if pid == me:
            continue
        tag, owner = _tag_and_node(pid)
        if tag is not None and not (owner and owner != node):
            out.append((pid, tag))
    return out


def _matches(tag: str, want: str | None, prefix: str | None, exclude: str | None) -> bool:
    if exclude is not None and tag == exclude:
        return False
    return (want is not None and tag == want) or (prefix is not None and tag.startswith(prefix))


def node_members(found: Scan | None = None, **tags: str | None) -> list[int]:
    """Our tagged processes on this node that have not exited (``tag`` exactly, or
    ``tag_prefix``, less ``exclude_tag``), from ``found`` (a scan) or a new one."""
    want, prefix, exclude = tags.get("tag"), tags.get("tag_prefix"), tags.get("exclude_tag")
    out = []
    for pid, tag in scan() if found is None else found:
        if not _matches(tag, want, prefix, exclude):
            continue
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            continue
    return sorted(out)


def step_tasks(tag: str, found: Scan | None = None) -> list[int]:
    """Our launch's tasks on this node: tagged ``tag``, children of ``slurmstepd``."""
    out = []
    for pid in node_members(found, tag=tag):
        try:
            parent = psutil.Process(pid).parent()
            if parent is not None and parent.name().startswith("slurmstepd"):
                out.append(pid)
        except psutil.Error:
            continue
    return sorted(out)


def sweep(pids: list[int], kill_timeout_s: float) -> dict[str, Any]:
    """SIGKILL this node's members (left behind by an ended step: no grace) and wait up
    to ``kill_timeout_s`` for them to vanish; the ones left are described."""
    procs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            p.kill()
            procs.append(p)
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=kill_timeout_s)
    survivors = []
    for p in alive:
        try:
            survivors.append(f"pid {p.pid} ({' '.join(p.cmdline())[:80]}) is {p.status()}")
        except psutil.Error:
            continue
    return {"members": pids, "sigkill_sent": [p.pid for p in procs], "survivors": survivors}


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on TCP ``port`` (``/proc/net/tcp``, ``tcp6``: cheap)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    # local address "ADDR:PORT" in hex, state 0A is LISTEN
                    if (
                        len(cols) > 9
                        and cols[3] == "0A"
                        and int(cols[1].rsplit(":", 1)[1], 16) == port
                    ):
                        inodes.add(cols[9])
        except (OSError, ValueError):
            continue
    return inodes


def port_holders(port: int) -> list[int]:
    """Pids listening on TCP ``port`` on this node (-1: one we may not see). The socket
    tables first: only a port that is listened on costs a look at every process's fds."""
    inodes = _listening_inodes(port)
    if not inodes:
        return []
    wanted = {f"socket:[{i}]" for i in inodes}
    holders: set[int] = set()
    for pid in psutil.pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    holders.add(pid)
                    break
            except OSError:
                continue
    return sorted(holders) or [-1]


def answer(
    ns: argparse.Namespace,
    probe: GpuProbe | None = None,
    *,
    first: bool | None = None,
    found: Scan | None = None,
) -> dict[str, Any]:
    """This node's answer to ``ns``. ``probe``: the GPU probe to use (the agent keeps one
    open for its life), else one opened and closed here; ``first``: whether this node is
    the request's first (the server step's node 0, the one ``--signal-leader`` signals),
    else Slurm's node id of this task says; ``found``: a scan of this node's processes
    taken for this question (else one is taken here)."""
    if first is None:
        first = os.environ.get("SLURM_NODEID", "0") == "0"
    out: dict[str, Any] = {"node": node_name()}
    tags = {"tag": ns.tag, "tag_prefix": ns.tag_prefix, "exclude_tag": ns.exclude_tag}
    if ns.tag or ns.tag_prefix:  # before any signal: the members as they were
        found = scan() if found is None else found
        out["members"] = node_members(found, **tags)
    # Only the request's first node signals: the server step's node 0.
    if ns.signal_leader and ns.tag and first:
        sig = signal.Signals["SIG" + ns.signal_leader]
        sent = []
        for pid in step_tasks(ns.tag, found):
            try:
                os.kill(pid, sig)
                sent.append(pid)
            except ProcessLookupError:
                continue
        out["signalled"] = sent
    if ns.sweep and (ns.tag or ns.tag_prefix):
        out["sweep"] = sweep(out["members"], ns.kill_timeout)
    if ns.port_holders:
        out["port_holders"] = port_holders(ns.port_holders)
    if not ns.no_gpus:
        own = probe is None
        use = gpu_probe(ns) if probe is None else probe
        try:
            out["gpus"] = gpus_json(use)
        except GpuQueryError as exc:
            out["gpu_error"] = str(exc)
        finally:
            if own:
                use.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    print(json.dumps(answer(ns), separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
