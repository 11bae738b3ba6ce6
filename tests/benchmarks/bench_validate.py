"""The second stage of validation: SGLang 0.5.23's own parser, resolution pipeline and
checks, run in the server's interpreter (``sglang_supervisor.sglang.resolution``). Goal: ≤ 3 s
median.

Prints, for the SGLang environment given (default ``.venv-sglang``, the test
environment built by ``scripts/sglang-parser-env.sh``):

* cold: a new helper (interpreter start, torch + SGLang + resolution hooks imported)
  until its first answer — what the first apply after a daemon start, or after a change
  of the lever env, pays (the daemon starts the helper at its own start-up);
* new environment: the first answer for an env lever never seen before (a fork of the
  warm helper takes it on where SGLang reads it when it runs; goal ≤ 2 s);
* warm: each later answer (a fork of the warm helper resolves one lever set), over the
  corpus of tests/integration/sglang_corpus.py, good and bad sets alternating.

    python -m tests.benchmarks.bench_validate [--python PATH] [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from sglang_supervisor.sglang.levers import LeverSet, check_levers, render_argv
from sglang_supervisor.sglang.resolution import GpuFacts, Resolver
from sglang_supervisor.sglang.schema import load_bundled
from tests.integration.sglang_corpus import BAD, CAUGHT_BY_LIMITS, GOOD

ROOT = Path(__file__).resolve().parents[2]
GOAL_S = 3.0
NEW_ENV_GOAL_S = 2.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=str(ROOT / ".venv-sglang" / "bin" / "python"))
    ap.add_argument("--rounds", type=int, default=2, help="passes over the corpus")
    ap.add_argument("--colds", type=int, default=3, help="cold starts to time")
    args = ap.parse_args()
    schema = load_bundled()
    gpu = GpuFacts.simulated(8, 143771)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SUPERVISOR")}
    sets = [g.levers for g in GOOD] + [b.levers for b in BAD if b.name not in CAUGHT_BY_LIMITS]
    argvs = [render_argv(check_levers(LeverSet(s), schema), schema) for s in sets]
    order = [argvs[i // 2] if i % 2 == 0 else argvs[-1 - i // 2] for i in range(len(argvs))]

    colds: list[float] = []
    for i in range(args.colds):
        resolver = Resolver()
        t0 = time.monotonic()
        resolver.resolve(args.python, argvs[0], {**env, "BENCH_COLD": str(i)}, gpu)
        colds.append(time.monotonic() - t0)
        resolver.close()

    resolver = Resolver()
    resolver.resolve(args.python, argvs[0], env, gpu)  # warm it
    warm: list[float] = []
    refused = 0
    for _ in range(args.rounds):
        for argv in order:
            t0 = time.monotonic()
            verdict = resolver.resolve(args.python, argv, env, gpu)
            warm.append(time.monotonic() - t0)
            refused += not verdict.ok
    # An env lever never seen before, of those SGLang reads when it runs: a fork of the
    # warm helper takes it on (before: a new helper imported SGLang for it, a cold start).
    t0 = time.monotonic()
    resolver.resolve(args.python, argvs[0], {**env, "SGLANG_BENCH_NEW_ENV": "1"}, gpu)
    new_env = time.monotonic() - t0
    resolver.close()

    load = os.getloadavg()[0]
    warm.sort()
    p90 = warm[int(0.9 * (len(warm) - 1))]
    print(f"SGLang environment: {args.python}  (load average {load:.2f}, {os.cpu_count()} CPUs)")
    print(
        f"cold (new helper -> first answer), {len(colds)} runs: median "
        f"{statistics.median(colds):.2f} s, min {min(colds):.2f} s, max {max(colds):.2f} s"
    )
    print(
        f"warm (one lever set), {len(warm)} runs ({refused} refused): median "
        f"{statistics.median(warm):.3f} s, p90 {p90:.3f} s, max {warm[-1]:.3f} s"
    )
    print(
        f"first validation in a new environment (SGLANG_BENCH_NEW_ENV set): {new_env:.2f} s "
        f"(goal {NEW_ENV_GOAL_S:.0f} s: {'met' if new_env <= NEW_ENV_GOAL_S else 'MISSED'})"
    )
    ok = statistics.median(warm) <= GOAL_S
    print(
        f"second stage median {statistics.median(warm):.3f} s vs goal {GOAL_S:.1f} s: "
        f"{'met' if ok else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
