"""The simulated KV-bound incident, planned on the server's own evidence and rehearsed:
what the plan proposes for unique and for shared-prefix prompts, the time without
service it expects, and the time the operation then records (issue 26 §2, 29 §3).

``python -m tests.benchmarks.bench_downtime [--scale F] [--host-ram-gib G]``

A real daemon (``serve --simulate``: 8 simulated H200s, tp 8, ``mem_fraction_static``
0.85, production timeouts but ``diagnosis_hold_s`` 20) under ``SGLANG_SIM_LOAD``
``rate=30,avg_tokens=32000`` with ``prefix_share`` 0 (unique prompts) and 0.5 (half of
each prompt shared): once the diagnosis holds KV-bound with the prefix cache's evidence,
``POST /plan``, then its apply, then a restart (whose stop unpins what the apply pinned).
The simulator pins and unpins at ``--scale`` × the H200 figures (0.58 and 0.2 s per GiB;
1.0 is the real cost: minutes for a large host cache), and the plan expects with the
same rates, so expected and measured sit side by side; the last column gives the plan's
figure at the H200 rates. Not part of ``tests.benchmarks.run`` (a full run takes
minutes at ``--scale 0.1``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from sglang_supervisor.planner.stopcost import MEASURED_PIN_S_PER_GIB, MEASURED_S_PER_PINNED_GIB
from tests.helpers import Daemon, wait_until

PRODUCTION = {
    "stop_grace_s": 30.0,
    "kill_timeout_s": 30.0,
    "release_timeout_s": 60.0,
    "ready_timeout_s": 600.0,
    "probation_s": 10.0,
    "diagnosis_hold_s": 20.0,
}
LOAD = "rate=30,avg_tokens=32000,seed=1"


def parts(op_or_plan: dict[str, Any]) -> dict[str, float | None]:
    down = op_or_plan.get("expected_downtime") or {"parts": []}
    return {p["name"]: p["seconds"] for p in down["parts"]}


def phase_s(op: dict[str, Any], name: str) -> float:
    return sum(p["duration_s"] or 0 for p in op["phases"] if p["name"] == name)


def run_case(tmp: Path, share: float, scale: float, host_ram_gib: int) -> dict[str, Any]:
    d = Daemon(
        tmp,
        gpus=8,
        levers={"model_path": "sim/llama", "tp_size": 8, "mem_fraction_static": 0.85},
        timeouts=PRODUCTION,
        sim={
            "host_ram_gib": host_ram_gib,
            "startup_s": 1.5,
            "health_s": 0.05,
            "pin_s_per_gib": MEASURED_PIN_S_PER_GIB * scale,
            "unpin_s_per_gib": MEASURED_S_PER_PINNED_GIB * scale,
        },
        extra={"server": {"env": {"SGLANG_SIM_LOAD": f"{LOAD},prefix_share={share:g}"}}},
    )
    d.start()
    d.client.timeout = httpx.Timeout(1800.0)  # an apply pins minutes at --scale 1
    try:

        def held() -> bool:
            diag = d.status()["diagnosis"]
            return diag["kind"] == "kv_bound" and diag["prefix_cache"] is not None

        wait_until(held, 120, 1.0, "a KV-bound diagnosis with prefix-cache evidence")
        plan = d.client.post("/plan", json={}).json()
        print(f"share {share:g}: planned {sorted(plan['levers'])}", file=sys.stderr)
        evidence = plan["workload"]["live"]["prefix_cache"]
        pinned = plan["proposed"]["host_ram_needed_bytes_per_node"] / 2**30
        apply = d.apply(plan["levers"]).json()["operation"]
        t0 = time.monotonic()
        restart = d.client.post("/restart", params={"wait": "true"}).json()["operation"]
        restart_s = time.monotonic() - t0
        return {
            "share": share,
            "hit_rate": evidence["hit_rate"],
            "evicted_per_prompt_token": evidence["evicted_per_prompt_token"],
            "host_cache": plan["host_cache"],
            "levers": plan["levers"],
            "pinned_gib": pinned,
            "plan_expected_s": plan["expected_downtime"]["seconds"],
            "apply_expected": parts(apply),
            "apply_expected_s": apply["expected_downtime"]["seconds"],
            "apply_measured_s": apply["downtime"]["seconds"],
            "apply_phases": {n: phase_s(apply, n) for n in ("stop", "release", "start")},
            "restart_measured_s": (restart.get("downtime") or {}).get("seconds"),
            "restart_phases": {n: phase_s(restart, n) for n in ("stop", "release", "start")},
            "restart_wall_s": restart_s,
            "h200_pin_s": MEASURED_PIN_S_PER_GIB * pinned,
            "h200_unpin_s": MEASURED_S_PER_PINNED_GIB * pinned,
        }
    finally:
        d.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.1, help="× the H200 pin/unpin rates")
    ap.add_argument("--host-ram-gib", type=int, default=2048)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, share in enumerate((0.0, 0.5)):
            sub = Path(tmp) / f"case{i}"
            sub.mkdir()
            rows.append(run_case(sub, share, args.scale, args.host_ram_gib))
    print(f"pin/unpin at {args.scale:g} × the H200 figures; host RAM {args.host_ram_gib} GiB")
    head = (
        "| prompts | hit rate | evicted/prompt tok | host cache | pinned GiB | apply: expected "
        "(stop, unpin, pin, load) | apply: measured (stop/release/start phases) | restart: "
        "measured (stop/release/start) | at the H200 rates: pin / unpin |"
    )
    print(head)
    print("|" + "---|" * 9)
    for r in rows:
        e = r["apply_expected"]
        ap_ph, rs_ph = r["apply_phases"], r["restart_phases"]
        print(
            f"| {'unique' if r['share'] == 0 else 'half shared'} | {r['hit_rate']:.2f} | "
            f"{r['evicted_per_prompt_token']:.2f} | "
            f"{'yes' if r['host_cache']['supported'] else 'no'} | {r['pinned_gib']:,.0f} | "
            f"{r['apply_expected_s']:.1f} s ({e['stop']:.1f}, {e['unpin']:.1f}, {e['pin']:.1f}, "
            f"{e['load'] if e['load'] is None else round(e['load'], 1)}) | "
            f"{r['apply_measured_s']:.1f} s ({ap_ph['stop']:.1f}/{ap_ph['release']:.1f}/"
            f"{ap_ph['start']:.1f}) | {r['restart_measured_s'] or 0:.1f} s "
            f"({rs_ph['stop']:.1f}/{rs_ph['release']:.1f}/{rs_ph['start']:.1f}) | "
            f"{r['h200_pin_s']:.0f} s / {r['h200_unpin_s']:.0f} s |"
        )
    for r in rows:
        print(
            f"share {r['share']:g}: levers {r['levers']}; host cache: {r['host_cache']['reason']}"
        )


if __name__ == "__main__":
    main()
