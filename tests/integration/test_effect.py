"""The measured effect through a real ``serve --simulate`` daemon under the simulator's
synthetic load (open loop: 50 requests a second of 200 tokens to generate): a guarded
change that caps the decode batch does worse and rolls back with the figures; an
unguarded one is judged by the watcher after its window; /status, /metrics and
``operations show`` say so."""

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


def test_a_worse_change_rolls_back_under_the_guard_and_an_unguarded_one_is_judged(
    daemon_factory: type[Daemon],
) -> None:
    d = daemon_factory(
        gpus=2,
        timeouts={"effect_window_s": 6.0},
        extra={"server": {"env": {"SGLANG_SIM_LOAD": LOAD}}},
    ).start()
    # A window's worth of history once the load has filled the server (2 s a request).
    wait_until(lambda: history_filled(d, 5), 40, 0.5, "five readings of the load")
    pid = d.status()["server"]["pid"]

    op: dict[str, Any] = d.apply({"max_running_requests": 8}, effect_guard=True).json()["operation"]
    assert op["state"] == "rolled_back", (op["effect"], op["phases"][-3:])
    names = [p["name"] for p in op["phases"]]
    assert names.index("probation") < names.index("effect") < names.index("rollback_stop")
    effect = op["effect"]
    assert effect["verdict"] == "worse" and effect["guard"] is True, effect
    assert (
        effect["after"]["generation_throughput_tps"]
        < 0.5 * (effect["before"]["generation_throughput_tps"])
    )
    assert effect["settle_s"] > 0  # the new server filled before its window
    assert "throughput" in op["rollback_reason"] and "effect_guard" in op["rollback_reason"]
    status = d.status()
    assert "max_running_requests" not in status["levers"] and status["server"]["pid"] != pid
    assert status["effect"]["operation"] == op["id"]
    assert metric(d, 'sglang_supervisor_effects_total{verdict="worse"}') == 1.0

    shown = cli(d, "operations", "show", op["id"])
    assert "effect   worse (the effect guard judged it): throughput" in shown.stdout, shown.stdout
    assert "throughput (tok/s)" in shown.stdout and "arrivals (requests/s)" in shown.stdout

    # Without the guard: committed at once, then judged by the watcher after its window.
    wait_until(lambda: history_filled(d, 10), 40, 0.5, "a window of the last-good server")
    op = d.apply({"mem_fraction_static": 0.84}).json()["operation"]
    assert op["state"] == "succeeded" and op["effect"]["verdict"] == "measuring", op

    def judged() -> dict[str, Any] | None:
        e: dict[str, Any] = d.status()["effect"]
        return e if e["operation"] == op["id"] and e["verdict"] != "measuring" else None

    effect = wait_until(judged, 30, 0.5, "the unguarded apply's effect judged")
    # The same open-loop load on a server that did not change its pace: comparable, and
    # throughput within the margin (the figures of both windows are there).
    assert effect["verdict"] in ("unchanged", "better", "mixed"), effect["detail"]
    assert effect["after"]["arrival_rate_rps"] and effect["before"]["arrival_rate_rps"]
    assert d.status()["levers"]["mem_fraction_static"] == 0.84
    assert metric(d, 'sglang_supervisor_last_effect_verdict{verdict="measuring"}') == 0.0
