"""The three paths of an apply side by side, on ``serve --simulate`` (one GPU, a small real
checkpoint): a live change (``log_requests`` + ``pp_max_micro_batch_size``), new weights of
the same model loaded in place, and a restart (``mem_fraction_static``), alternating, each
apply's wall time and phases, the medians and their ratios to the restart. Whether the
server's pid changed is asserted for each.

    python -m tests.benchmarks.bench_paths [--rounds N]

The simulated restart's stop waits for SGLang's SIGTERM watchdog (a look every 5 s,
``SGLANG_SIM_DRAIN_CHECK_S``), as a real SGLang does; its start is the simulated load (0.2 s).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from tests.checkpoints import write_checkpoint
from tests.helpers import Daemon


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-paths-"))
    a, b = write_checkpoint(work / "a", fill=1), write_checkpoint(work / "b", fill=2)
    d = Daemon(work, gpus=1, levers={"model_path": str(a), "tp_size": 1})
    d.start()
    times: dict[str, list[float]] = {"live": [], "weights": [], "restart": []}
    phases: dict[str, list[dict[str, float]]] = {k: [] for k in times}
    try:
        for i in range(args.rounds):
            for levers in (
                {"log_requests": i % 2 == 0, "pp_max_micro_batch_size": 8 + i},
                {"model_path": str(b if i % 2 == 0 else a)},
                {"mem_fraction_static": 0.80 + i / 100},
            ):
                pid = d.status()["server"]["pid"]
                op: dict[str, Any] = d.apply(levers).json()["operation"]
                assert op["state"] == "succeeded", op
                same = d.status()["server"]["pid"] == pid
                assert same == (op["path"] != "restart"), (op["path"], same)
                times[op["path"]].append(op["duration_s"])
                phases[op["path"]].append({p["name"]: p["duration_s"] for p in op["phases"]})
    finally:
        d.stop()
        d.client.close()
    restart = statistics.median(times["restart"])
    print(f"{'path':<8} {'apply (median)':>15} {'vs restart':>11}  phases (median s)")
    for path, values in times.items():
        med = statistics.median(values)
        names = phases[path][0]
        cols = ", ".join(
            f"{n} {statistics.median(p.get(n, 0.0) for p in phases[path]):.3f}" for n in names
        )
        print(f"{path:<8} {med:>14.3f}s {med / restart:>11.3f}  {cols}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
