"""A rollout behind the real sglang-router, three ways in one run, side by side: one replica
at a time, ``--max-unavailable 2``, and ``--canary 1 --max-unavailable 2`` (the canary
held until its measured effect is proven no worse).

    python -m tests.benchmarks.bench_rollout [--replicas 4] [--concurrency 16]
        [--window 10] [--no-save]

The real ``sglang-router`` (``scripts/router-env.sh``) fronts ``replicas`` daemons
(``serve --simulate``, each with ``[router] url``, its own state dir and simulated GPUs),
as in ``bench_router``: ``concurrency`` streaming clients (``router_load``) run through
the router the whole time, generations of 40-100 tokens at 20 tokens/s. Each simulated
server also carries its own open-loop load (``SGLANG_SIM_LOAD``, 40 requests a second):
the arrival rate the canary's effect is judged under does not follow the canary's speed,
as closed-loop clients' would. The three rollouts run one after the other on the same
fleet (each changes ``mem_fraction_static`` by 0.01), the canary's after an effect
window of quiet, so its before-window holds no restart. For each: its exit code, how
long it took, and the streaming requests that started during it — ok, failed (no token),
truncated (a stream cut). Loopback only; every process is stopped at the end. Results:
printed, and written to ``tests/benchmarks/results/rollout.json`` / ``rollout.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.benchmarks.bench_router import RESULTS, Scenario, _daemon, _wait_listed
from tests.benchmarks.router_load import Load, LoadSpec, Outcome, window_stats
from tests.helpers import Daemon
from tests.routerkit import Router

#: (name, rollout options, the new mem_fraction_static).
ROLLOUTS: tuple[tuple[str, tuple[str, ...], float], ...] = (
    ("one at a time", (), 0.84),
    ("--max-unavailable 2", ("--max-unavailable", "2"), 0.83),
    ("--canary 1 --max-unavailable 2", ("--canary", "1", "--max-unavailable", "2"), 0.82),
)
#: How long a replica out of the router waits for its requests (``[router] drain_timeout_s``).
DRAIN_S = 6.0
#: Each server's own open-loop load: 40 requests a second, 100 tokens each (5 s at 20/s).
SIM_LOAD = "rate=40,avg_tokens=600,out_tokens=100,seed=3"


@dataclass
class RolloutResult:
    name: str
    exit_code: int
    took_s: float
    during: dict[str, Any]
    output: str


def _rollout(
    daemons: list[Daemon], options: tuple[str, ...], fraction: float
) -> tuple[int, float, str]:
    argv = [sys.executable, "-m", "sglang_supervisor_api.cli", "rollout", *options]
    argv += ["--set", f"mem_fraction_static={fraction}"]
    for d in daemons:
        argv += ["--daemon", d.url]
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    return p.returncode, time.monotonic() - t0, p.stdout + p.stderr


async def _drive(
    router: Router, daemons: list[Daemon], spec: LoadSpec, window_s: float
) -> list[RolloutResult]:
    load = Load(router.url, spec)
    runner = asyncio.create_task(load.run())
    # The fleet fills, and every replica has a window of history before the first.
    await asyncio.sleep(2 * window_s + 5)
    runs = []
    for name, options, fraction in ROLLOUTS:
        if "--canary" in options:
            await asyncio.sleep(2 * window_s)  # the canary's before-window holds no restart
        t0 = time.monotonic()
        code, took, output = await asyncio.to_thread(_rollout, daemons, options, fraction)
        runs.append((name, code, took, output, t0, time.monotonic()))
        print(f"== {name}: exit {code} in {took:.1f} s", flush=True)
        print(output[-1500:], flush=True)
    await asyncio.sleep(5)
    load.stop()
    await asyncio.wait_for(runner, timeout=spec.request_timeout_s + 30)
    results = []
    for name, code, took, output, t0, t1 in runs:
        # Counted once every request has ended (one still streaming is not a failure).
        during: list[Outcome] = [o for o in load.outcomes if t0 <= o.started < t1]
        results.append(RolloutResult(name, code, took, window_stats(during), output[-3000:]))
        for e in results[-1].during["errors"]:
            print(f"  {name}: a client saw: {e}", flush=True)
    return results


def run(replicas: int, concurrency: int, window_s: float, tmp: Path) -> list[RolloutResult]:
    s = Scenario(
        "rollout",
        True,
        replicas,
        timeouts={"effect_window_s": window_s},
        server_env={"SGLANG_SIM_LOAD": SIM_LOAD},
        # The server's own load never drains (it does not come through the router): the
        # streams the router sent end within seconds; the rest drain on SIGTERM.
        drain_s=DRAIN_S,
    )
    router = Router(tmp / "router.log")
    daemons: list[Daemon] = []
    try:
        for k in range(replicas):
            d = _daemon(tmp, k, router.url, s)
            daemons.append(d)
            d.spawn()
        for d in daemons:
            d.wait_started()
        _wait_listed(router, replicas)
        spec = LoadSpec(concurrency=concurrency, min_tokens=40, max_tokens=100)
        return asyncio.run(_drive(router, daemons, spec, window_s))
    finally:
        for d in daemons:
            with contextlib.suppress(Exception):
                d.stop(timeout=120)
            d.client.close()
        router.stop()


def render(results: list[RolloutResult], replicas: int, concurrency: int) -> str:
    base = next((r.took_s for r in results if r.name == "one at a time"), None)
    lines = [
        f"{replicas} replicas behind sglang-router, {concurrency} streaming clients, "
        f"each server's own load {SIM_LOAD}",
        "",
        "| rollout | exit | took (s) | vs one at a time | requests during | ok | failed "
        "| truncated | TTFT p50 / p99 (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        w = r.during
        ratio = "-" if not base else f"{r.took_s / base:.2f}"
        ttft = "-" if w["ttft_p50_s"] is None else f"{w['ttft_p50_s']:.2f} / {w['ttft_p99_s']:.2f}"
        lines.append(
            f"| {r.name} | {r.exit_code} | {r.took_s:.1f} | {ratio} | {w['requests']} | "
            f"{w['ok']} | {w['failed']} | {w['truncated']} | {ttft} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--window", type=float, default=10.0, help="[timeouts] effect_window_s")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        results = run(args.replicas, args.concurrency, args.window, Path(tmp))
    text = render(results, args.replicas, args.concurrency)
    print(text)
    if not args.no_save:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "rollout.json").write_text(
            json.dumps([asdict(r) for r in results], indent=2) + "\n"
        )
        (RESULTS / "rollout.md").write_text(text + "\n")
    return 0 if all(r.exit_code == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
