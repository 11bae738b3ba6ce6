"""One simulated SGLang worker process: a TP rank (scheduler) or the detokenizer.

A rank "holds" GPU memory by registering it in the simulated-GPU registry
(``<registry>/<pid>.json``, written atomically); the simulated probe counts it for as long
as this process is alive and not a zombie. The rank then idles until SIGTERM (exit 0) or
SIGKILL. It does not watch its parent: a launcher killed alone leaves its ranks holding
memory, as real SGLang schedulers do. With a pinned host pool (``--unpin-s``) its memory
stays held that long past the SIGTERM (``held_until`` in its entry): unpinning is what a
real rank's exit waits for, in userspace or in the kernel. A SIGKILL frees it at once
(the simulation cannot outlive it; a real rank would not free any sooner).

Standard library only, so that nine of these start fast.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path


def create_time(pid: int) -> float | None:
    """This pid's start time in seconds since the epoch, computed as psutil does on Linux
    (``starttime`` of ``/proc/<pid>/stat`` in clock ticks + ``btime`` of ``/proc/stat``),
    so the probe can tell a reused pid. None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # Fields after the command name, which may itself hold spaces and parentheses.
        fields = stat.rpartition(b")")[2].split()
        ticks = float(fields[19])  # field 22 of stat(5): starttime
        with open("/proc/stat", "rb") as f:
            btime = next(float(line.split()[1]) for line in f if line.startswith(b"btime"))
        return ticks / os.sysconf("SC_CLK_TCK") + btime
    except (OSError, IndexError, ValueError, StopIteration):
        return None


def register(registry: Path, gpu_uuid: str, nbytes: int, held_until: float | None = None) -> Path:
    """Write this process's registry entry atomically (tmp file + ``os.replace``);
    ``held_until`` (unix time): the memory stays held that long after the process."""
    pid = os.getpid()
    entry: dict[str, object] = {
        "pid": pid,
        "create_time": create_time(pid),
        "gpu_uuid": gpu_uuid,
        "bytes": nbytes,
    }
    if held_until is not None:
        entry["held_until"] = held_until
    path = registry / f"{pid}.json"
    tmp = registry / f".{pid}.json.tmp"
    tmp.write_text(json.dumps(entry))
    os.replace(tmp, path)
    return path


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sglang_supervisor.sim.rank")
    p.add_argument("--registry", type=Path, required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--gpu-uuid", default="")
    p.add_argument("--bytes", type=int, default=0)
    p.add_argument("--detokenizer", action="store_true")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument("--setsid", action="store_true")
    p.add_argument("--unpin-s", type=float, default=0.0)
    return p.parse_args(argv)


def _log(name: str, message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    # One write per line: the launcher and its other children append to the same log.
    try:
        sys.stdout.write(f"[{stamp} {name}] {message}\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass  # the log is gone; the rank's memory is what matters


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    name = "DETOKENIZER" if args.detokenizer else f"TP{args.rank}"
    if args.setsid:
        os.setsid()  # the detach_ranks fault: escape the launcher's process group

    stop_signals = {signal.SIGTERM, signal.SIGINT}
    if args.ignore_sigterm:
        for sig in stop_signals:
            signal.signal(sig, signal.SIG_IGN)
    else:
        # Blocked and taken with sigwait: no handler, no race between a check and a pause.
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)

    entry: Path | None = None
    if not args.detokenizer:
        entry = register(args.registry, args.gpu_uuid, args.bytes)
        _log(name, f"holding {args.bytes / 2**30:.2f} GiB on {args.gpu_uuid} (pid {os.getpid()})")
    if args.ignore_sigterm:
        while True:
            time.sleep(3600)  # only SIGKILL ends this process
    received = signal.sigwait(stop_signals)
    _log(name, f"received {signal.Signals(received).name}; exiting (pid {os.getpid()})")
    if entry is not None and args.unpin_s > 0:
        # The GPU memory stays held until the host pool is unpinned.
        register(args.registry, args.gpu_uuid, args.bytes, time.time() + args.unpin_s)
        _log(name, f"unpinning the host pool: its GPU memory is held {args.unpin_s:.1f} s more")
    elif entry is not None:
        # Cosmetic: the probe ignores entries of dead pids anyway.
        entry.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
