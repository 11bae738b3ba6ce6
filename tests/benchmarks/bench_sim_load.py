"""The simulated server's scheduler under its synthetic load, lever set beside lever set:
what docs/simulated-backend.md's KV-bound table shows.

    python -m tests.benchmarks.bench_sim_load [--load rate=30,avg_tokens=32000] [--seconds 45]
        [--gpus 8]

Each lever set is resolved as the simulated launcher resolves it (``sim.capacity.resolve``:
the planner's pool, SGLang's default ``max_running_requests``, the chunk, the activation
limit, the CUDA graphs' batch, ``schedule_conservativeness``) and its engine built as the
launcher builds it (``sim.lifecycle``); the load is ticked every 0.1 s of a fake clock,
so one run takes about a second of CPU and prints the same figures every time (a seed).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sglang_supervisor.sim import capacity
from sglang_supervisor.sim.gpus import DEFAULT_MEMORY_MIB
from sglang_supervisor.sim.load import Engine, parse_load
from sglang_supervisor.sim.scheduler import EngineStats

GPU_BYTES = DEFAULT_MEMORY_MIB * 2**20
#: The documented sets: SGLang's default, the host cache alone, the plan's proposal.
SETS: dict[str, dict[str, Any]] = {
    "mem_fraction_static 0.85, bf16 KV": {"mem_fraction_static": 0.85},
    "+ hierarchical cache only": {"mem_fraction_static": 0.85, "enable_hierarchical_cache": True},
    "+ plan (fp8 KV, 0.928, chunk 4096)": {
        "mem_fraction_static": 0.928,
        "kv_cache_dtype": "fp8_e4m3",
        "chunked_prefill_size": 4096,
    },
}


def engine_for(levers: dict[str, Any], load: str) -> tuple[capacity.Resolved, Engine]:
    r = capacity.resolve(capacity.SIM_MODEL, levers, GPU_BYTES, env={capacity.HOST_RAM_ENV: "2048"})
    e = Engine(
        r.max_total_num_tokens,
        max(1, r.max_running_requests_per_worker),
        workers=r.capacity.kv_pools,
        host_cache_tokens=r.host_pool_tokens,
        decode_graph_max_bs=r.decode_graph_max_bs,
        load=parse_load(load),
        prefill_batch_tokens=r.prefill_batch_tokens,
        prefill_limit_tokens=capacity.prefill_limit_tokens(r, GPU_BYTES),
        schedule_conservativeness=r.capacity.schedule_conservativeness,
        clock=lambda: 0.0,
    )
    return r, e


def run(levers: dict[str, Any], load: str, seconds: float) -> tuple[int, list[EngineStats]]:
    """The set's KV tokens per rank, and the engine's figures every 15 s."""
    r, e = engine_for(levers, load)
    t, marks = 0.0, []
    for tick in range(1, int(seconds * 10) + 1):
        t = tick / 10
        e.tick(t)
        if tick % 150 == 0:
            marks.append(e.stats())
    return r.max_total_num_tokens, marks


def render(load: str, seconds: float, tp: int) -> str:
    lines = [
        f"load {load}, tp {tp}, {seconds:g} s (figures at 15, 30, 45 s)",
        "",
        "| levers | KV tokens per rank | running | queued | throughput (tok/s) "
        "| TTFT (s) | ITL (ms) | retracted | cache hit rate |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, levers in SETS.items():
        tokens, marks = run({"tp_size": tp, **levers}, load, seconds)
        s = marks[-1]
        ttft = s.ttft_sum_s / max(1, s.ttft_count)
        itl = 1000 * s.itl_sum_s / max(1, s.itl_count)
        lines.append(
            f"| {name} | {tokens:,} | {' → '.join(str(m.running) for m in marks)} | "
            f"{' → '.join(str(m.queued) for m in marks)} | {s.gen_throughput:,.0f} | "
            f"{ttft:.1f} | {itl:.0f} | {s.retracted_total} | {s.cache_hit_rate:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--load", default="rate=30,avg_tokens=32000")
    p.add_argument("--seconds", type=float, default=45.0)
    p.add_argument("--gpus", type=int, default=8, help="tp_size (one rank per GPU)")
    args = p.parse_args(argv)
    print(render(args.load, max(15.0, args.seconds), args.gpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
