"""Zero failed requests behind sglang-router: a lever change rolled across every replica
under a streaming load, with the router integration on, against the same without it.

    python -m tests.benchmarks.bench_router [--duration 60] [--concurrency 16]
        [--replicas 3] [--only integration|control|single] [--no-save]

The real ``sglang-router`` (``scripts/router-env.sh``) fronts ``replicas`` daemons
(``serve --simulate``, each its own state dir and simulated GPUs; the simulated servers
generate at ``TOKENS_PER_S`` per request, so a request of 40-100 tokens lasts 2-5 s,
and keep SGLang's own pauses: /health_generate ~1 s, the SIGTERM watchdog every 5 s).
``concurrency`` streaming clients (``router_load``) run through the router; after a
warm-up a ``sglang-supervisor rollout`` applies ``mem_fraction_static`` to every replica,
one at a time; the load goes on until ``duration`` and at least 10 s past the rollout.

* integration: every daemon has ``[router] url``: it registers its server itself, and
  takes it out of the router and drains it before each stop;
* control: the same router and rollout, daemons without ``[router]`` (the harness adds
  the servers to the router once): plain applies behind the router;
* single: one daemon without ``[router]`` and no router at all, the clients streaming
  straight to its server: a plain apply (the rollout of one daemon), what a single server
  does to its clients during a change.

Requests are counted by when they started: before the rollout, during it, after it.
Loopback only; every process is stopped at the end. Results: printed, and written to
``tests/benchmarks/results/router.json`` / ``router.md``.
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.benchmarks.router_load import Load, LoadSpec, Outcome, window_stats
from tests.helpers import Daemon
from tests.routerkit import Router

RESULTS = Path(__file__).with_name("results")
TOKENS_PER_S = 20.0
#: The simulated servers keep SGLang's own pauses (not the test suite's short ones).
SERVER_ENV = {
    "SGLANG_SIM_TOKENS_PER_S": str(TOKENS_PER_S),
    "SGLANG_SIM_HEALTH_S": "1.0",
    "SGLANG_SIM_DRAIN_CHECK_S": "5.0",
}
#: Production timeouts but a shorter probation (3 replicas x 10 s would dominate).
TIMEOUTS: dict[str, Any] = {
    "stop_grace_s": 30.0,
    "kill_timeout_s": 30.0,
    "release_timeout_s": 60.0,
    "ready_timeout_s": 120.0,
    "probation_s": 3.0,
    "liveness_interval_s": 10.0,
    "liveness_timeout_s": 30.0,
    "liveness_failures": 3,
}


@dataclass
class Scenario:
    name: str
    integration: bool
    replicas: int = 3
    duration_s: float = 60.0
    warmup_s: float = 12.0
    tail_s: float = 10.0
    load: LoadSpec = field(default_factory=LoadSpec)
    #: Overrides of SERVER_ENV / TIMEOUTS (the test suite's shorter run).
    server_env: dict[str, str] = field(default_factory=dict)
    timeouts: dict[str, Any] = field(default_factory=dict)
    startup_s: float = 2.0
    #: False: no router; the clients stream straight to the one server.
    router: bool = True
    #: ``[router] drain_timeout_s`` of the daemons.
    drain_s: float = 60.0


@dataclass
class ScenarioResult:
    name: str
    integration: bool
    rollout_exit: int
    rollout_s: float
    before: dict[str, Any]
    during: dict[str, Any]
    after: dict[str, Any]
    total: dict[str, Any]
    rollout_output: str


def _daemon(tmp: Path, k: int, router_url: str | None, s: Scenario) -> Daemon:
    extra: dict[str, Any] = {}
    if router_url:
        extra["router"] = {"url": router_url, "drain_timeout_s": s.drain_s, "drain_poll_s": 0.25}
    home = tmp / f"replica{k}"
    home.mkdir()
    d = Daemon(
        home,
        gpus=2,
        levers={"model_path": "sim/llama", "tp_size": 2, "mem_fraction_static": 0.85},
        timeouts={**TIMEOUTS, **s.timeouts},
        sim={"startup_s": s.startup_s},
        extra=extra,
    )
    d.env.update({**SERVER_ENV, **s.server_env})
    return d


def _rollout(daemons: list[Daemon]) -> tuple[int, float, str]:
    argv = [
        sys.executable,
        "-m",
        "sglang_supervisor_api.cli",
        "rollout",
        "--set",
        "mem_fraction_static=0.84",
    ]
    for d in daemons:
        argv += ["--daemon", d.url]
    t0 = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    return p.returncode, time.monotonic() - t0, p.stdout + p.stderr


def _wait_listed(router: Router, n: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        healthy = [w for w in router.workers() if w.get("is_healthy")]
        if len(healthy) >= n:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(f"router lists {len(healthy)} of {n} workers healthy")
        time.sleep(0.2)


async def _drive(s: Scenario, url: str, daemons: list[Daemon]) -> ScenarioResult:
    load = Load(url, s.load)
    runner = asyncio.create_task(load.run())
    await asyncio.sleep(s.warmup_s)
    t_roll = time.monotonic()
    code, took, output = await asyncio.to_thread(_rollout, daemons)
    t_end = time.monotonic()
    await asyncio.sleep(max(s.tail_s, s.duration_s - (t_end - t_roll) - s.warmup_s))
    load.stop()
    await asyncio.wait_for(runner, timeout=s.load.request_timeout_s + 30)

    def window(lo: float, hi: float) -> list[Outcome]:
        return [o for o in load.outcomes if lo <= o.started < hi]

    return ScenarioResult(
        name=s.name,
        integration=s.integration,
        rollout_exit=code,
        rollout_s=took,
        before=window_stats(window(0.0, t_roll)),
        during=window_stats(window(t_roll, t_end)),
        after=window_stats(window(t_end, float("inf"))),
        total=window_stats(load.outcomes),
        rollout_output=output[-4000:],
    )


def run_scenario(s: Scenario, tmp: Path) -> ScenarioResult:
    """One scenario from a clean start to a clean stop."""
    router = Router(tmp / "router.log") if s.router else None
    daemons: list[Daemon] = []
    try:
        for k in range(s.replicas):
            d = _daemon(tmp, k, router.url if router and s.integration else None, s)
            daemons.append(d)
            d.start(wait_ready=True)
        if router is None:
            return asyncio.run(_drive(s, f"http://127.0.0.1:{daemons[0].server_port}", daemons))
        if not s.integration:
            for d in daemons:
                r = httpx.post(
                    f"{router.url}/workers",
                    json={"url": f"http://127.0.0.1:{d.server_port}"},
                    timeout=10,
                )
                r.raise_for_status()
        _wait_listed(router, s.replicas)
        return asyncio.run(_drive(s, router.url, daemons))
    finally:
        for d in daemons:
            with contextlib.suppress(Exception):
                d.stop(timeout=120)
            d.client.close()
        if router is not None:
            router.stop()


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def render(results: list[ScenarioResult]) -> str:
    lines = [
        "| scenario | window | requests | ok | failed | truncated | TTFT p50 / p99 (s) "
        "| e2e p50 / p99 (s) |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        for label, w in (("before", r.before), ("during", r.during), ("after", r.after)):
            lines.append(
                f"| {r.name} | {label} | {w['requests']} | {w['ok']} | {w['failed']} | "
                f"{w['truncated']} | {_fmt(w['ttft_p50_s'])} / {_fmt(w['ttft_p99_s'])} | "
                f"{_fmt(w['e2e_p50_s'])} / {_fmt(w['e2e_p99_s'])} |"
            )
    lines.append("")
    lines.append("| scenario | rollout exit | rollout duration (s) | failed | truncated |")
    lines.append("|---|---:|---:|---:|---:|")
    for r in results:
        lines.append(
            f"| {r.name} | {r.rollout_exit} | {r.rollout_s:.1f} | {r.total['failed']} | "
            f"{r.total['truncated']} |"
        )
    return "\n".join(lines)


def _merge_saved(path: Path, results: list[ScenarioResult]) -> list[dict[str, Any]]:
    """The saved scenarios with these results in place of their namesakes (``--only``
    re-runs one scenario and keeps the others' last figures)."""
    saved: list[dict[str, Any]] = json.loads(path.read_text()) if path.exists() else []
    fresh = {r.name: asdict(r) for r in results}
    merged = [fresh.pop(r["name"], r) for r in saved]
    return merged + list(fresh.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--only", choices=["integration", "control", "single"])
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    load = LoadSpec(concurrency=args.concurrency, min_tokens=40, max_tokens=100)
    scenarios = [
        Scenario(name, name == "integration", args.replicas, args.duration, load=load)
        for name in ("integration", "control")
        if args.only in (None, name)
    ]
    if args.only in (None, "single"):
        scenarios.append(Scenario("single", False, 1, args.duration, load=load, router=False))
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-router-") as tmp:
        for s in scenarios:
            sub = Path(tmp) / s.name
            sub.mkdir()
            via = "through the router" if s.router else "straight to the server, no router"
            print(
                f"== {s.name}: {s.replicas} replicas, {args.concurrency} streams {via}",
                flush=True,
            )
            results.append(run_scenario(s, sub))
            print(results[-1].rollout_output, flush=True)
            for label in ("before", "during", "after"):
                for e in getattr(results[-1], label)["errors"]:
                    print(f"  {label}: {e}", flush=True)
    print(render(results))
    if not args.no_save:
        RESULTS.mkdir(exist_ok=True)
        saved = _merge_saved(RESULTS / "router.json", results)
        (RESULTS / "router.json").write_text(json.dumps(saved, indent=2) + "\n")
        (RESULTS / "router.md").write_text(render([ScenarioResult(**r) for r in saved]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
