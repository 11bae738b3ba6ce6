"""What a hierarchical cache's host pool costs at start and at stop, pinned the way SGLang
0.5.23 pins it, on a real GPU host: one process, and several at once (a node's ranks).

``python -m tests.benchmarks.h200_pinning --out DIR [--sizes 8,48,96] [--procs 8]``
(``--dry-run``: no CUDA, the flow only, with the pages touched instead of registered).

SGLang allocates the pool as a plain tensor and registers it with ``cudaHostRegister``
in chunks of ``SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB`` (256) GB
(``mem_cache/pool_host/common.py:143-190`` ``_cuda_host_register``, :330-353
``alloc_with_host_register``); at a graceful exit each scheduler unregisters it in
userspace (``HostKVCache.destroy``, ``mem_cache/pool_host/base.py:283-300``), otherwise
the kernel unpins it while the process exits. Each case runs in worker processes (one
CUDA context each), timed by themselves (register, unregister) and by this harness
(SIGKILL → the process gone from /proc):

- ``graceful``: register, unregister, exit — what a start and a graceful stop cost;
- ``killed``: register, then SIGKILL — the kernel's unpinning at exit;
- ``parallel``: ``--procs`` workers of ``size / procs`` GiB each at once, both ways: whether
  a node's ranks pin and unpin in parallel (the planner charges the node's total at the
  one-process rate: ``supervisor/planner/stopcost.py``).

Sizes are capped at 60 % of the RAM available. Results: ``DIR/h200_pinning.json`` and a
table on stdout. The figures the planner uses today come from torch's ``pin_memory``
(``tests/benchmarks/results/h200_teardown.md``); this measures SGLang's own path.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GIB = 1 << 30
CHUNK = 256 * 10**9  # SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB's default, in bytes


def worker(gib: float, dry: bool) -> None:
    """One process: allocate, register (``READY {...}``), then obey stdin: ``unregister``
    (then ``DONE {...}``) or wait to be killed."""
    import torch

    n = int(gib * GIB)
    t0 = time.monotonic()
    buf = torch.empty(n, dtype=torch.uint8)
    alloc_s = time.monotonic() - t0
    t1 = time.monotonic()
    ranges = []
    if dry:
        buf[::4096] = 1  # touch every page: the faults a registration takes
    else:
        cudart = torch.cuda.cudart()
        torch.cuda.init()
        base, off = buf.data_ptr(), 0
        while off < n:
            size = min(CHUNK, n - off)
            rc = int(cudart.cudaHostRegister(base + off, size, 0))
            if rc != 0:
                raise SystemExit(f"cudaHostRegister failed: rc={rc}")
            ranges.append(base + off)
            off += size
    register_s = time.monotonic() - t1
    print("READY " + json.dumps({"alloc_s": alloc_s, "register_s": register_s}), flush=True)
    for line in sys.stdin:
        if line.strip() == "unregister":
            t2 = time.monotonic()
            if not dry:
                for ptr in ranges:
                    torch.cuda.cudart().cudaHostUnregister(ptr)
            unregister_s = time.monotonic() - t2
            print("DONE " + json.dumps({"unregister_s": unregister_s}), flush=True)
            return


def _spawn(gib: float, dry: bool) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "tests.benchmarks.h200_pinning", "--worker", str(gib)]
    return subprocess.Popen(
        argv + (["--dry-run"] if dry else []),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _read(p: subprocess.Popen[str], tag: str) -> dict[str, Any]:
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith(tag + " "):
            return dict(json.loads(line[len(tag) + 1 :]))
    raise RuntimeError(f"worker {p.pid} ended before {tag}: rc={p.wait()}")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except OSError:
        return True


def run_case(sizes: list[float], dry: bool, killed: bool) -> dict[str, Any]:
    """``len(sizes)`` workers at once; registered, then unregistered or SIGKILLed."""
    t0 = time.monotonic()
    procs = [_spawn(g, dry) for g in sizes]
    ready = [_read(p, "READY") for p in procs]
    all_registered_s = time.monotonic() - t0
    out: dict[str, Any] = {
        "gib_each": sizes[0],
        "procs": len(sizes),
        "register_s": [r["register_s"] for r in ready],
        "spawn_to_all_registered_s": all_registered_s,
    }
    t1 = time.monotonic()
    if killed:
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
        while not all(_gone(p.pid) for p in procs):
            time.sleep(0.005)
        out["sigkill_to_all_gone_s"] = time.monotonic() - t1
    else:
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("unregister\n")
            p.stdin.flush()
        out["unregister_s"] = [_read(p, "DONE")["unregister_s"] for p in procs]
        for p in procs:
            p.wait()
        out["request_to_all_exited_s"] = time.monotonic() - t1
    for p in procs:
        p.wait()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--sizes", default="8,48,96", help="GiB per case, comma-separated")
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--worker", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        worker(args.worker, args.dry_run)
        return
    import psutil

    cap = 0.6 * psutil.virtual_memory().available / GIB
    sizes = [min(float(s), cap) for s in args.sizes.split(",")]
    results: list[dict[str, Any]] = []
    for gib in sizes:
        for killed in (False, True):
            one = run_case([gib], args.dry_run, killed)
            many = run_case([gib / args.procs] * args.procs, args.dry_run, killed)
            results += [{**one, "case": "killed" if killed else "graceful"}]
            results += [{**many, "case": ("killed" if killed else "graceful") + " parallel"}]
    meta = {"dry_run": args.dry_run, "host_ram_available_gib": cap / 0.6, "procs": args.procs}
    print("| case | GiB in all | procs | register s (max) | s per GiB | stop s | stop s per GiB |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        total = r["gib_each"] * r["procs"]
        reg = max(r["register_s"])
        stop = r.get("sigkill_to_all_gone_s") or r["request_to_all_exited_s"]
        print(
            f"| {r['case']} | {total:.0f} | {r['procs']} | {reg:.2f} | {reg / total:.3f} | "
            f"{stop:.2f} | {stop / total:.3f} |"
        )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"meta": meta, "results": results}, indent=1)
        (args.out / "h200_pinning.json").write_text(text)


if __name__ == "__main__":
    main()
