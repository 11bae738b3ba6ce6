"""A lever is proposed only where the measured bottleneck says it helps, each with its
effect in the bottleneck's unit and its cost in seconds; the hierarchical cache only on
the prefix cache's evidence, never for concurrency; the change's expected time without
service, part by part (issue 26 §2, 29 §3).

The incident this guards: on the simulated KV-bound load with unique prompts the plan
proposed ``hicache_size`` for 953.7 GiB pinned, whose pinning alone costs minutes at every
stop and start, for a cache that could keep nothing that comes back.
"""

from __future__ import annotations

from typing import Any

import pytest

from sglang_supervisor import planner
from sglang_supervisor.observe.startuplog import graph_seconds_each
from sglang_supervisor.planner import GiB, Hardware, LiveLoad
from sglang_supervisor.planner.diagnosis import LoadKind
from sglang_supervisor.planner.downtime import ServerFacts
from sglang_supervisor.planner.memory import decode_graph_sizes
from sglang_supervisor.planner.stopcost import MEASURED_PIN_S_PER_GIB, MEASURED_S_PER_PINNED_GIB
from sglang_supervisor.sim import capacity
from tests.planner_evidence import REUSED_PREFIXES_EVICTED, UNIQUE_PROMPTS, kv_bound

H200 = 143771 * 2**20
HW = Hardware(gpus=8, gpu_memory_bytes=H200, host_ram_available_bytes=2048 * GiB)
CURRENT = {"model_path": "sim/llama", "tp_size": 8, "mem_fraction_static": 0.85}
HOST_CACHE = {"enable_hierarchical_cache", "hicache_size"}


def plan(live: LiveLoad | None, **kw: Any) -> planner.Plan:
    return planner.propose(capacity.SIM_MODEL, HW, CURRENT, avg_tokens=32_000, live=live, **kw)


def test_unique_prompts_get_the_capacity_levers_and_no_host_cache() -> None:
    p = plan(kv_bound(UNIQUE_PROMPTS))
    assert {"kv_cache_dtype", "mem_fraction_static", "max_running_requests"} <= set(p.levers)
    assert not HOST_CACHE & set(p.levers)
    assert p.proposed.host_ram_needed_bytes == 0
    assert p.host_cache["supported"] is False
    assert "share no prefixes" in p.host_cache["reason"]
    assert any(n.startswith("Host cache: the cache hit rate is 0.00") for n in p.notes)


def test_shared_prefixes_lost_to_eviction_get_the_host_cache_with_its_cost() -> None:
    p = plan(kv_bound(REUSED_PREFIXES_EVICTED))
    assert set(p.levers) >= HOST_CACHE
    notes = {n.lever: n for n in p.lever_notes}
    hicache = notes["enable_hierarchical_cache"]
    assert hicache.effect is not None and hicache.cost is not None
    # One host pool: stated once, not twice (hicache_size's own note points there).
    size_cost = notes["hicache_size"].cost
    assert size_cost is not None and size_cost["start_s"] == 0
    assert size_cost["basis"] == "counted with enable_hierarchical_cache"
    assert hicache.effect["unit"] == "cache hit rate" and hicache.effect["now"] == 0.28
    assert "not more requests at once" in hicache.effect["text"]
    pinned = p.proposed.host_ram_needed_bytes_per_node / GiB
    assert hicache.cost["start_s"] == round(MEASURED_PIN_S_PER_GIB * pinned, 1)
    assert hicache.cost["stop_s"] == round(MEASURED_S_PER_PINNED_GIB * pinned, 1)
    assert "h200_teardown.md" in hicache.cost["basis"]
    down = p.expected_downtime
    assert down is not None
    parts = {part.name: part for part in down.parts}
    assert parts["pin"].seconds == pytest.approx(MEASURED_PIN_S_PER_GIB * pinned)
    assert down.seconds >= parts["pin"].seconds + parts["stop"].seconds  # type: ignore[operator]


def test_the_capacity_levers_state_their_effect_in_requests_at_once() -> None:
    p = plan(kv_bound(UNIQUE_PROMPTS))
    notes = {n.lever: n for n in p.lever_notes}
    for lever in ("kv_cache_dtype", "mem_fraction_static", "max_running_requests"):
        effect = notes[lever].effect
        assert effect is not None and effect["unit"] == "requests running at once", lever
    # Each on top of the ones before: they add up to current -> proposed.
    first = notes["kv_cache_dtype"].effect
    last = notes["max_running_requests"].effect
    assert first is not None and last is not None
    assert first["now"] == min(p.current.concurrent_requests, p.current.max_running_requests)
    assert last["expected"] == min(p.proposed.concurrent_requests, p.proposed.max_running_requests)
    assert first["expected"] > first["now"]  # fp8 halves the bytes per token
    graphs = notes["cuda_graph_max_bs_decode"].cost
    assert graphs is not None and graphs["start_s"] is None  # no capture measured here
    assert "decode graphs to capture" in graphs["basis"]


def test_not_saturated_proposes_nothing_and_a_target_sizes_for_it() -> None:
    calm = LiveLoad(running_requests=20, queued_requests=0, token_usage=0.3)
    p = plan(calm)
    assert p.levers == {} and p.expected_downtime is None
    assert p.bottleneck["kind"] == "not_saturated"
    assert p.notes[0].startswith("not saturated: no lever would make today's load faster")
    p = plan(calm, target_concurrency=150)
    assert {"kv_cache_dtype", "max_running_requests"} <= set(p.levers)


def test_queue_bound_at_the_cap_raises_only_the_cap() -> None:
    levers = {**CURRENT, "max_running_requests": 40}
    at_cap = LiveLoad(running_requests=40, queued_requests=200, token_usage=0.5)
    p = planner.propose(capacity.SIM_MODEL, HW, levers, avg_tokens=32_000, live=at_cap)
    assert set(p.levers) <= {"max_running_requests", "cuda_graph_max_bs_decode"}
    assert p.levers["max_running_requests"] > 40
    below = LiveLoad(running_requests=20, queued_requests=200, token_usage=0.5)
    p = planner.propose(capacity.SIM_MODEL, HW, levers, avg_tokens=32_000, live=below)
    assert p.levers == {}
    assert "the limit is compute" in p.notes[0]


def test_offline_sizing_proposes_capacity_but_never_a_host_cache() -> None:
    p = plan(None)
    assert {"kv_cache_dtype", "mem_fraction_static"} <= set(p.levers)
    assert not HOST_CACHE & set(p.levers)
    assert "no live prefix-cache figures" in p.host_cache["reason"]


def test_expected_downtime_from_the_measured_start() -> None:
    facts = ServerFacts(stop_grace_s=30, probation_s=10, in_flight=380, measured_start_s=40.0)
    p = plan(kv_bound(REUSED_PREFIXES_EVICTED), facts=facts)
    down = p.expected_downtime
    assert down is not None and down.complete
    parts = {part.name: part for part in down.parts}
    # A lone server with requests in flight: SGLang serves on for the whole grace.
    assert parts["stop"].seconds == 30 and "stop_grace_s" in parts["stop"].basis
    assert parts["load"].seconds == pytest.approx(40.0)  # the same weights per GPU
    assert not parts["drain"].without_service and not parts["probation"].without_service
    total = sum(part.seconds or 0 for part in down.parts if part.name not in ("drain", "probation"))
    assert down.seconds == pytest.approx(total)
    assert down.to_json()["summary"].startswith(f"≈{down.seconds:.0f} s without service")
    # Behind a router, the replica is out of it from its drain to the end of probation.
    routed = ServerFacts(probation_s=10, drain_s=300, behind_router=True, measured_start_s=40)
    p = plan(kv_bound(REUSED_PREFIXES_EVICTED), facts=routed)
    assert p.expected_downtime is not None
    parts = {part.name: part for part in p.expected_downtime.parts}
    assert parts["drain"].without_service and parts["probation"].without_service
    assert parts["stop"].seconds == 5  # the drain emptied it: SGLang's next look


def test_without_a_measured_start_the_downtime_says_so() -> None:
    p = plan(kv_bound(UNIQUE_PROMPTS))
    down = p.expected_downtime
    assert down is not None and not down.complete
    assert down.to_json()["summary"].startswith("at least")
    load = next(part for part in down.parts if part.name == "load")
    assert load.seconds is None and "not measured" in load.basis


def test_more_decode_graphs_cost_the_serving_servers_capture_time() -> None:
    # SGLang 0.5.23's line (cuda_graph_setup.py:786-791), as its f-string writes it.
    bs = [1, 2, 4, 8, 12, 16]
    line = (
        f"[TP0] Capture target decode CUDA graph end. bs={bs}, elapsed=3.00 s, "
        "mem usage=0.41 GB, avail mem=12.30 GB."
    )
    each = graph_seconds_each("Load weight end.\n" + line + "\n")
    assert each == pytest.approx(0.5)
    p = plan(kv_bound(UNIQUE_PROMPTS), facts=ServerFacts(graph_s_each=each, measured_start_s=20))
    cost = {n.lever: n for n in p.lever_notes}["cuda_graph_max_bs_decode"].cost
    assert cost is not None
    now = len(decode_graph_sizes(p.current.cuda_graph_max_bs_decode or 0))
    new = len(decode_graph_sizes(p.proposed.cuda_graph_max_bs_decode or 0))
    assert cost["start_s"] == round((new - now) * 0.5, 1) != 0
    assert (
        graph_seconds_each("Capture cuda graph begin. This can take up to several minutes.") is None
    )


def test_the_plan_follows_the_held_diagnosis_not_one_sample() -> None:
    """The daemon's diagnosis held KV-bound for diagnosis_hold_s; the sample /plan reads
    dips to 0.91 usage with 1,398 queued (seen on the simulated Kimi-K2.5 incident): by
    that sample alone it is queue-bound below the cap, and nothing would be proposed."""
    dip = LiveLoad(running_requests=198, queued_requests=1398, token_usage=0.91)
    assert plan(dip).levers == {} and plan(dip).bottleneck["kind"] == "queue_bound"
    held = LiveLoad(
        running_requests=198, queued_requests=1398, token_usage=0.91, held=LoadKind.KV_BOUND
    )
    p = plan(held)
    assert p.bottleneck["kind"] == "kv_bound"
    assert {"kv_cache_dtype", "mem_fraction_static", "max_running_requests"} <= set(p.levers)
    assert p.diagnosis.startswith("KV-cache bound: token usage 0.91 with 198 requests")
    # A held "no metrics" or "not saturated" leaves the sample to decide: it lags a load
    # that has just grown (here a KV-bound sample).
    for lagging in (LoadKind.NO_METRICS, LoadKind.NOT_SATURATED):
        grown = plan(LiveLoad(198, 1398, 0.99, held=lagging))
        assert grown.bottleneck["kind"] == "kv_bound", lagging
        assert plan(LiveLoad(198, 1398, 0.91, held=lagging)).levers == {}
