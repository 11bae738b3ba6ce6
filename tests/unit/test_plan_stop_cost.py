"""The plan knows what a stop costs: with 2,048 GiB of host RAM it proposed pinning
1,833 GiB for the hierarchical cache, and at the measured ≈0.2 s per pinned GiB
(docs/design.md; systemd/sglang-supervisor.service) a stop then takes ~6 min, past the unit's
TimeoutStopSec=360. The plan keeps the daemon's teardown deadline (stop_grace_s +
kill_timeout_s + release_timeout_s + release_s_per_pinned_gib × GiB) within
[timeouts] stop_budget_s and states the stop and start time of its proposal."""

from __future__ import annotations

from pathlib import Path

from sglang_supervisor import planner
from sglang_supervisor.config import TimeoutSettings
from sglang_supervisor.planner.stopcost import StopBudget
from tests.planner_cases import H200, planner_model
from tests.planner_evidence import kv_bound

GiB = 1 << 30


def _budget(t: TimeoutSettings) -> StopBudget:
    return StopBudget(
        budget_s=t.stop_budget_s,
        stop_grace_s=t.stop_grace_s,
        kill_timeout_s=t.kill_timeout_s,
        release_timeout_s=t.release_timeout_s,
        release_s_per_pinned_gib=t.release_s_per_pinned_gib,
    )


def _plan(stop: StopBudget | None) -> planner.Plan:
    hw = planner.Hardware(
        gpus=8, gpu_memory_bytes=H200, host_ram_available_bytes=2048 * GiB, stop=stop
    )
    return planner.propose(
        planner_model("DeepSeek-V3"), hw, {"tp_size": 8}, avg_tokens=4096, live=kv_bound()
    )


def test_without_a_budget_the_plan_pins_1833_gib() -> None:
    """The issue's figure: (2048 − 10 − 204.8) GiB over 8 ranks."""
    plan = _plan(None)
    assert plan.levers["enable_hierarchical_cache"] is True
    assert round(plan.proposed.host_ram_needed_bytes / GiB) in range(1820, 1834)


def test_the_stop_budget_is_the_units_timeoutstopsec() -> None:
    unit = Path(__file__).resolve().parents[2] / "systemd" / "sglang-supervisor.service"
    (line,) = [x for x in unit.read_text().splitlines() if x.startswith("TimeoutStopSec=")]
    assert float(line.split("=", 1)[1]) == TimeoutSettings().stop_budget_s


def test_the_proposal_stops_within_the_services_budget() -> None:
    defaults = TimeoutSettings()
    assert defaults.stop_budget_s == 360  # systemd/sglang-supervisor.service TimeoutStopSec
    stop = _budget(defaults)
    plan = _plan(stop)
    pinned = plan.proposed.host_ram_needed_bytes
    assert plan.levers["enable_hierarchical_cache"] is True
    # (360 − 30 − 30 − 60) / 0.25 = 960 GiB at most.
    assert 900 * GiB < pinned <= 960 * GiB
    cost = plan.to_json()["stop_cost"]["proposed"]
    assert cost["within_stop_budget"] is True and cost["stop_deadline_s"] <= 360
    assert cost["expected_stop_s"] == round(0.2 * pinned / GiB, 1)
    assert cost["expected_pinning_at_start_s"] > 0
    (note,) = [n for n in plan.notes if n.startswith("Host cache kept to")]
    assert "stop budget of 360 s" in note and "TimeoutStopSec" in note


def test_a_current_cache_past_the_budget_is_named() -> None:
    stop = _budget(TimeoutSettings())
    hw = planner.Hardware(
        gpus=8, gpu_memory_bytes=H200, host_ram_available_bytes=2048 * GiB, stop=stop
    )
    current = {"tp_size": 8, "enable_hierarchical_cache": True, "hicache_size": 200}
    plan = planner.propose(planner_model("DeepSeek-V3"), hw, current, avg_tokens=4096)
    cost = plan.to_json()["stop_cost"]
    assert cost["current"]["within_stop_budget"] is False  # 1,490 GiB: 403 s deadline
    assert cost["proposed"]["within_stop_budget"] is True
    assert any("past the service's stop budget of 360 s" in n for n in plan.notes)
