"""Issue 26 §2 on the simulated server, through the real daemon: the decision reads the
server's own metrics (``sglang:cached_tokens_total``, ``sglang:evicted_tokens_total``,
through the telemetry and the diagnosis's window), not the load's knob. Shared prefixes
lost to eviction: the capacity levers and the host cache, with its cost; applied, the
rehearsal charges the pinning the plan expected ([sim] pin_s_per_gib), and the operation
records the time without service."""

from __future__ import annotations

import tomllib
from typing import Any

from tests.helpers import Daemon, wait_until, write_toml

LOAD = "rate=40,avg_tokens=16000,seed=1"
#: Pinning kept short here (the H200's 0.58 s/GiB would make ~450 GiB take minutes).
PIN_S_PER_GIB = 0.005


def evidence_plan(d: Daemon) -> dict[str, Any]:
    """The plan once the diagnosis holds KV-bound with the prefix cache's evidence."""

    def held() -> bool:
        diagnosis = d.status()["diagnosis"]
        return diagnosis["kind"] == "kv_bound" and diagnosis["prefix_cache"] is not None

    wait_until(held, 40, 0.5, "a KV-bound diagnosis with prefix-cache evidence")
    r = d.client.post("/plan", json={})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_the_host_cache_is_proposed_on_evidence_and_its_cost_is_rehearsed(
    daemon_factory: type[Daemon],
) -> None:
    d = daemon_factory(
        gpus=4,
        timeouts={"diagnosis_hold_s": 4},
        sim={"host_ram_gib": 512, "pin_s_per_gib": PIN_S_PER_GIB, "unpin_s_per_gib": 0.002},
    )
    config = tomllib.loads(d.config_path.read_text())
    config["server"]["env"] = {"SGLANG_SIM_LOAD": f"{LOAD},prefix_share=0.5"}
    write_toml(d.config_path, config)
    d.start()

    # Half of each prompt shared: the server's counters show reuse lost to eviction. (Unique
    # prompts, which evict as much and hit nothing, get no host cache: the same telemetry
    # and rule, in tests/unit/test_prefix_evidence.py.)
    shared = evidence_plan(d)
    assert shared["host_cache"]["supported"] is True, shared["host_cache"]
    assert shared["levers"]["enable_hierarchical_cache"] is True
    notes = {n["lever"]: n for n in shared["lever_notes"]}
    cost = notes["enable_hierarchical_cache"]["cost"]
    pinned_gib = shared["proposed"]["host_ram_needed_bytes_per_node"] / 2**30
    assert cost["start_s"] == round(PIN_S_PER_GIB * pinned_gib, 1) > 0
    assert "[sim] pin_s_per_gib" in cost["basis"]
    assert notes["enable_hierarchical_cache"]["effect"]["unit"] == "cache hit rate"

    r = d.apply(shared["levers"])
    op = r.json()["operation"]
    assert op["state"] == "succeeded", r.text
    expected = {p["name"]: p for p in op["expected_downtime"]["parts"]}
    assert expected["pin"]["seconds"] == round(PIN_S_PER_GIB * pinned_gib, 2)
    start = next(p for p in op["phases"] if p["name"] == "start")
    assert start["duration_s"] >= expected["pin"]["seconds"]  # the rehearsal pinned it
    assert op["downtime"]["serving_again"] is True
    assert op["downtime"]["seconds"] >= start["duration_s"]
