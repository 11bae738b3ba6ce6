"""The founding incident, end to end (issue 26 §4): Kimi-K2.5 (its published config,
``tests/data/models/kimi-k2.5``) on 8 simulated H200s with 408 GiB of host RAM, SGLang's
defaults at TP 8, and an open-loop load of ≈4,000-token requests that keeps 100+ queued.

The operator runs ``sglang-supervisor plan --apply``. With unique prompts — the incident's
workload — the daemon's diagnosis holds KV-bound, the plan proposes the KV-capacity levers
the evidence supports (attention DP, an fp8 KV cache, the request cap and the graphs that
cover it) within SGLang's own default fraction for exactly the proposed set and no host
cache, shows the time without service before anything stops, commits, and the measured
effect says the queue drained and more requests run. With half of each prompt shared and
lost to eviction, the host cache is proposed, with what its pinning costs.

The planner's fraction equals SGLang 0.5.23's own for the proposed set
(``arg_groups/memory_hook.py:331-336``, the vision tower's cut): checked against SGLang
itself in ``tests/integration/test_planner_oracle.py``; here the daemon's plan is held to
it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Daemon, wait_until
from tests.integration.test_cli import cli

KIMI = Path(__file__).resolve().parents[1] / "data" / "models" / "kimi-k2.5"
#: 60 requests a second of ≈4,000 tokens (1,500 of them generated): KV-bound at SGLang's
#: defaults, with well over 100 queued.
LOAD = "rate=60,avg_tokens=4000,out_tokens=1500,seed=1"
TIMEOUTS = {"diagnosis_hold_s": 10.0, "effect_window_s": 12.0}


def incident(daemon_factory: type[Daemon], share: float, sim: dict[str, Any]) -> Daemon:
    d = daemon_factory(
        gpus=8,
        levers={"model_path": str(KIMI), "tp_size": 8},
        timeouts=TIMEOUTS,
        sim={"host_ram_gib": 408, **sim},
        extra={"server": {"env": {"SGLANG_SIM_LOAD": f"{LOAD},prefix_share={share:g}"}}},
    )
    return d.start()


def kv_bound_with_evidence(d: Daemon) -> dict[str, Any] | None:
    diag: dict[str, Any] = d.status()["diagnosis"]
    held = diag["kind"] == "kv_bound" and diag["prefix_cache"] is not None
    return diag if held else None


def history_filled(d: Daemon, n: int) -> bool:
    body = d.client.get("/history").json()
    return sum(v is not None for v in body["arrivals_per_s"]) >= n


def test_unique_prompts_plan_apply_commits_kv_levers_and_the_queue_drains(
    daemon_factory: type[Daemon],
) -> None:
    d = incident(daemon_factory, 0.0, {})
    wait_until(lambda: kv_bound_with_evidence(d), 120, 0.5, "a KV-bound diagnosis held")
    wait_until(lambda: history_filled(d, 14), 60, 0.5, "a before-window of the load")
    before_pid = d.status()["server"]["pid"]

    r = cli(d, "plan", "--apply", "--json", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    body = json.loads(r.stdout)
    plan, op = body["plan"], body["operation"]
    # The evidence: KV-bound with 100+ queued, no prefix to keep.
    live = plan["workload"]["live"]
    assert plan["bottleneck"]["kind"] == "kv_bound", plan["bottleneck"]
    assert live["queued_requests"] > 100, live
    assert live["prefix_cache"]["hit_rate"] < 0.1, live["prefix_cache"]
    # The proposal: KV capacity, within SGLang's own default for the proposed set, no
    # host cache (a prefix cache buys no concurrency).
    levers = plan["levers"]
    assert levers["kv_cache_dtype"] == "fp8_e4m3" and levers["attn_dp_size"] == 8, levers
    assert not levers.get("enable_hierarchical_cache") and "hicache_size" not in levers
    assert plan["host_cache"]["supported"] is False
    assert "share no prefixes" in plan["host_cache"]["reason"]
    proposed = plan["proposed"]
    assert proposed["mem_fraction_static"] <= proposed["sglang_default_fraction"] < 0.806
    assert proposed["concurrent_requests"] > 4 * plan["current"]["concurrent_requests"]
    # Its cost before the stop, from the figures the apply then carries.
    expected = plan["expected_downtime"]
    assert expected["complete"] and expected["seconds"] > 0
    assert {p["name"] for p in expected["parts"]} >= {"stop", "load", "pin", "unpin"}
    assert op["state"] == "succeeded", op
    assert op["expected_downtime"]["seconds"] > 0 and op["downtime"]["serving_again"], op
    assert "without service:" in cli(d, "operations", "show", op["id"]).stdout

    st = d.status()
    assert st["server"]["pid"] != before_pid
    assert {k: st["levers"].get(k) for k in levers} == levers
    # The new server's own pool is the one planned (the planner's target: within 0.5 %).
    served = st["server"]["max_total_num_tokens"]
    assert served == pytest.approx(proposed["kv_tokens_per_rank"], rel=0.005), st["server"]

    def judged() -> dict[str, Any] | None:
        e: dict[str, Any] = d.status()["effect"]
        return e if e["operation"] == op["id"] and e["verdict"] != "measuring" else None

    effect = wait_until(judged, 120, 0.5, "the apply's effect judged")
    before, after = effect["before"], effect["after"]
    # The figures the README quotes (pytest -s prints them).
    figures = {
        "levers": levers,
        "fraction": [plan["current"]["mem_fraction_static"], proposed["mem_fraction_static"]],
        "kv_tokens_per_rank": [plan["current"]["kv_tokens_per_rank"], served],
        "requests_at_once": [
            plan["current"]["concurrent_requests"],
            proposed["concurrent_requests"],
        ],
        "expected_s": expected["seconds"],
        "measured_s": op["downtime"]["seconds"],
        "effect": {k: [before.get(k), after.get(k)] for k in before},
        "verdict": effect["verdict"],
    }
    print("INCIDENT", json.dumps(figures))
    assert effect["verdict"] == "better", effect
    assert before["queued_requests"] > 100 > after["queued_requests"], effect
    assert after["running_requests"] > 2 * before["running_requests"], effect


def test_shared_prefixes_lost_to_eviction_get_the_host_cache_with_its_cost(
    daemon_factory: type[Daemon],
) -> None:
    # Pinning at a hundredth of the H200's 0.58 s per GiB: the cost shows, the test is quick.
    d = incident(daemon_factory, 0.5, {"pin_s_per_gib": 0.0058, "unpin_s_per_gib": 0.002})
    diag = wait_until(lambda: kv_bound_with_evidence(d), 120, 0.5, "a KV-bound diagnosis held")
    evidence = diag["prefix_cache"]
    assert evidence["hit_rate"] >= 0.1 and evidence["evicted_per_prompt_token"] >= 0.1, evidence

    r = cli(d, "plan", "--json", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    plan = json.loads(r.stdout)
    assert plan["host_cache"]["supported"] is True, plan["host_cache"]
    levers = plan["levers"]
    assert levers["enable_hierarchical_cache"] is True and levers["hicache_size"] > 0, levers
    pinned_gib = plan["proposed"]["host_ram_needed_bytes_per_node"] / 2**30
    assert 0 < pinned_gib <= 408, pinned_gib
    parts = {p["name"]: p for p in plan["expected_downtime"]["parts"]}
    # The pinning at the simulator's rate, in the time without service.
    assert parts["pin"]["seconds"] == round(0.0058 * pinned_gib, 2), parts["pin"]
    assert parts["pin"]["without_service"] and "s per GiB" in parts["pin"]["basis"]
    # The capacity levers come too: the workload is still KV-bound.
    assert levers["kv_cache_dtype"] == "fp8_e4m3", levers
    figures = {
        "hit_rate": evidence["hit_rate"],
        "evicted_per_prompt_token": evidence["evicted_per_prompt_token"],
        "levers": levers,
        "pinned_gib": round(pinned_gib, 1),
        "pin_s": parts["pin"]["seconds"],
        "expected_s": plan["expected_downtime"]["seconds"],
        "pin_s_at_h200_rate": round(0.58 * pinned_gib, 1),
    }
    print("INCIDENT-SHARED", json.dumps(figures))
    # And the text an operator reads says what the host cache costs.
    text = cli(d, "plan", timeout=120).stdout
    assert "pin" in text and "without service" in text, text
