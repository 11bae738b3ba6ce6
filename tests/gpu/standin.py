"""A stand-in for an SGLang server's process tree, holding real GPU memory with torch.

Launcher mode (no ``--rank``): spawns ``--ranks`` children in its own session and process
group (plain ``subprocess``, like SGLang's schedulers), then waits; SIGTERM kills it with
the default action, leaving its ranks orphaned, the harsh case. Each rank allocates
``--gib`` GiB on its CUDA device with a plain ``torch.empty`` (cudaMalloc through the
caching allocator), optionally pins ``--pin-gib`` GiB of host memory (rank
``--pin-rank`` only, like a hierarchical-cache host pool), prints one ``READY`` line and
sleeps. Ranks listed in ``--ignore-sigterm`` ignore SIGTERM, so only SIGKILL ends them.

    python tests/gpu/standin.py --ranks 4 --gib 4 --ignore-sigterm 1 --pin-gib 8

Every rank uses the first visible CUDA device: give the GPU through CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import subprocess
import sys
import time

GIB = 2**30


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--gib", type=float, default=1.0, help="GPU memory per rank, GiB")
    p.add_argument("--ignore-sigterm", type=int, nargs="*", default=[], metavar="RANK")
    p.add_argument("--pin-gib", type=float, default=0.0, help="pinned host memory, GiB")
    p.add_argument("--pin-rank", type=int, default=0)
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def run_rank(args: argparse.Namespace) -> None:
    rank = args.rank
    if rank in args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    torch = importlib.import_module("torch")  # late: the launcher never touches CUDA

    t0 = time.monotonic()
    gpu = torch.empty(int(args.gib * GIB), dtype=torch.uint8, device="cuda")
    gpu.fill_(rank + 1)
    torch.cuda.synchronize()
    t_gpu = time.monotonic() - t0
    pinned = None
    t_pin = 0.0
    if args.pin_gib > 0 and rank == args.pin_rank:
        t1 = time.monotonic()
        pinned = torch.empty(int(args.pin_gib * GIB), dtype=torch.uint8, pin_memory=True)
        t_pin = time.monotonic() - t1
    print(
        f"READY rank={rank} pid={os.getpid()} gpu_gib={args.gib} "
        f"pinned_gib={args.pin_gib if pinned is not None else 0} "
        f"ignore_sigterm={rank in args.ignore_sigterm} "
        f"alloc_s={t_gpu:.3f} pin_s={t_pin:.3f}",
        flush=True,
    )
    while True:
        time.sleep(3600)


def run_launcher(args: argparse.Namespace) -> int:
    print(f"LAUNCHER pid={os.getpid()} ranks={args.ranks}", flush=True)
    passthrough = [
        "--ranks",
        str(args.ranks),
        "--gib",
        str(args.gib),
        "--pin-gib",
        str(args.pin_gib),
        "--pin-rank",
        str(args.pin_rank),
        "--ignore-sigterm",
        *map(str, args.ignore_sigterm),
    ]
    children = [
        subprocess.Popen([sys.executable, __file__, *passthrough, "--rank", str(r)])
        for r in range(args.ranks)
    ]
    while True:  # a rank that dies on its own takes the launcher down, like SGLang
        for r, child in enumerate(children):
            rc = child.poll()
            if rc is not None:
                print(f"LAUNCHER rank {r} exited with {rc}; exiting", flush=True)
                return 1
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.rank is not None:
        run_rank(args)
        return 0
    return run_launcher(args)


if __name__ == "__main__":
    sys.exit(main())
