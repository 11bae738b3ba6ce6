"""The measured effect through a real ``serve --simulate`` daemon under the simulator's
synthetic load (open loop: 50 requests a second of 200 tokens to generate): a change that
caps the decode batch commits, and the watcher judges its effect worse once its window
is over; /status, /metrics and ``operations show`` say so. (The guard's rollback on a
real daemon: tests/integration/test_rollout.py's canaries.)"""

from __future__ import annotations

from typing import Any

from tests.helpers import Daemon, wait_until
from tests.integration.test_cli import cli

LOAD = "rate=50,avg_tokens=1000,out_tokens=200,seed=1"


def history_filled(d: Daemon, n: int) -> bool:
    body = d.client.get("/history").json()
    return sum(v is not None for v in body["arrivals_per_s"]) >= n


def metric(d: Daemon, line_start: str) -> float | None:
    for line in d.client.get("/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_an_unguarded_change_is_committed_then_judged_by_the_watcher(
    daemon_factory: type[Daemon],
) -> None:
    d = daemon_factory(
        gpus=2,
        timeouts={"effect_window_s": 6.0},
        extra={"server": {"env": {"SGLANG_SIM_LOAD": LOAD}}},
    ).start()
    # A window's worth of history once the load has filled the server (2 s a request).
    wait_until(lambda: history_filled(d, 5), 40, 0.5, "five readings of the load")

    op: dict[str, Any] = d.apply({"max_running_requests": 8}).json()["operation"]
    assert op["state"] == "succeeded" and "effect" not in [p["name"] for p in op["phases"]]
    assert op["effect"]["verdict"] == "measuring" and op["effect"]["guard"] is False, op
    assert op["effect"]["settle_s"] > 0  # the new server fills before its window
    assert d.status()["levers"]["max_running_requests"] == 8  # committed at once

    def judged() -> dict[str, Any] | None:
        e: dict[str, Any] = d.status()["effect"]
        return e if e["operation"] == op["id"] and e["verdict"] != "measuring" else None

    effect = wait_until(judged, 40, 0.5, "the apply's effect judged by the watcher")
    assert effect["verdict"] == "worse", effect["detail"]
    before, after = effect["before"], effect["after"]
    assert after["generation_throughput_tps"] < 0.5 * before["generation_throughput_tps"]
    assert after["running_requests"] <= 8 < before["running_requests"]
    assert "under comparable load" in effect["detail"]
    assert metric(d, 'sglang_supervisor_effects_total{verdict="worse"}') == 1.0
    assert metric(d, 'sglang_supervisor_last_effect_verdict{verdict="worse"}') == 1.0
    tput = metric(
        d, 'sglang_supervisor_last_effect_generation_throughput_tokens_per_second{window="after"}'
    )
    assert tput == after["generation_throughput_tps"]

    shown = cli(d, "operations", "show", op["id"])
    assert "effect   worse: throughput" in shown.stdout, shown.stdout
    assert "throughput (tok/s)" in shown.stdout and "arrivals (requests/s)" in shown.stdout
    listed = cli(d, "operations")
    assert f"{op['id']}  apply  succeeded" in listed.stdout and "  worse  " in listed.stdout
