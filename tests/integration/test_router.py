"""The daemon behind the real sglang-router 0.3: it registers its server, takes it out
before a stop, puts the new one (or the last-good one) back, and a router that does not
answer never blocks a stop. The rollout under load: no client request fails or is cut."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.benchmarks.bench_router import Scenario, run_scenario
from tests.benchmarks.router_load import LoadSpec
from tests.helpers import Daemon, wait_until
from tests.routerkit import Router, free_port, needs_router, router

pytestmark = needs_router()
__all__ = ["router"]  # the fixture


def worker_urls(router: Router, healthy: bool = True) -> list[str]:
    return sorted(str(w["url"]) for w in router.workers() if w.get("is_healthy") or not healthy)


def phases(op: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {p["name"]: (p["state"], p.get("detail") or "") for p in op["phases"]}


def metric(d: Daemon, name: str) -> float | None:
    for line in d.client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_registered_at_start_out_before_a_stop_back_after_an_apply(
    daemon_factory: type[Daemon], router: Router
) -> None:
    d = daemon_factory(gpus=2, extra={"router": {"url": router.url, "drain_poll_s": 0.1}})
    d.start()
    me = f"http://127.0.0.1:{d.server_port}"
    wait_until(lambda: worker_urls(router) == [me], 30, 0.1, "the router to list the server")
    status = d.status()
    assert status["router"] == {
        "url": router.url,
        "worker_url": me,
        "registered": True,
        "error": None,
    }
    assert metric(d, "sglang_supervisor_router_worker_registered") == 1.0

    op = d.apply({"mem_fraction_static": 0.84}).json()["operation"]
    assert op["state"] == "succeeded", op
    steps = phases(op)
    names = [p["name"] for p in op["phases"]]
    assert names.index("router_remove") < names.index("drain") < names.index("stop")
    assert names.index("probation") < names.index("router_add") < names.index("commit")
    assert steps["drain"] == ("succeeded", "no running or queued requests")
    assert worker_urls(router) == [me]
    assert d.status()["last_drain"]["requests_left"] == 0

    r = d.client.post("/stop", params={"wait": "true"})
    assert r.json()["operation"]["state"] == "succeeded"
    assert router.workers() == []  # stopped: it stays out of the router
    assert d.status()["router"]["registered"] is False
    assert metric(d, "sglang_supervisor_router_worker_registered") == 0.0


def test_a_rollback_puts_the_last_good_server_back(
    daemon_factory: type[Daemon], router: Router
) -> None:
    d = daemon_factory(gpus=2, extra={"router": {"url": router.url}})
    d.start()
    me = f"http://127.0.0.1:{d.server_port}"
    wait_until(lambda: worker_urls(router) == [me], 30, 0.1, "the router to list the server")
    op = d.apply(env={"SGLANG_SIM_FAULTS": "crash_on_start"}).json()["operation"]
    assert op["state"] == "rolled_back", op
    assert phases(op)["rollback_router_add"][0] == "succeeded"
    assert worker_urls(router) == [me]
    assert d.status()["router"]["registered"] is True


def test_a_router_that_does_not_answer_never_blocks_a_stop(daemon_factory: type[Daemon]) -> None:
    away = f"http://127.0.0.1:{free_port()}"
    d = daemon_factory(gpus=2, extra={"router": {"url": away, "request_timeout_s": 1.0}})
    d.start()
    status = d.status()
    assert status["state"] == "ready"  # it serves; the router's failure is reported
    assert status["router"]["registered"] is None
    assert f"router unreachable: GET {away}/workers failed" in status["router"]["error"]
    r = d.client.post("/stop", params={"wait": "true"})
    op = r.json()["operation"]
    assert op["state"] == "succeeded", op
    state, detail = phases(op)["router_remove"]
    assert state == "failed" and "stopping anyway" in detail
    # Still in a router that does not answer, it would never drain: no drain is waited.
    assert "drain" not in phases(op)
    assert d.status()["state"] == "stopped"


def test_rollout_under_streaming_load_fails_and_cuts_nothing(tmp_path: Path) -> None:
    """The benchmark's integration scenario, shorter: 2 replicas, 6 streams of ~1 s."""
    s = Scenario(
        "integration",
        integration=True,
        replicas=2,
        duration_s=8.0,
        warmup_s=3.0,
        tail_s=2.0,
        load=LoadSpec(concurrency=6, min_tokens=10, max_tokens=30),
        server_env={"SGLANG_SIM_HEALTH_S": "0.2", "SGLANG_SIM_DRAIN_CHECK_S": "0.5"},
        timeouts={"probation_s": 0.5},
        startup_s=0.3,
    )
    result = run_scenario(s, tmp_path)
    assert result.rollout_exit == 0, result.rollout_output
    assert result.during["requests"] > 0
    assert (result.total["failed"], result.total["truncated"]) == (0, 0), result.total


def test_an_adopted_server_stays_registered_and_a_daemon_exit_takes_it_out(
    daemon_factory: type[Daemon], router: Router
) -> None:
    d = daemon_factory(gpus=2, extra={"router": {"url": router.url}})
    d.env["SGLANG_SUPERVISOR_KEEP_SERVER"] = "1"
    d.start()
    me = f"http://127.0.0.1:{d.server_port}"
    wait_until(lambda: worker_urls(router) == [me], 30, 0.1, "the router to list the server")
    ids = [w["id"] for w in router.workers()]
    pid = d.status()["server"]["pid"]
    assert d.stop() == 0  # keep mode: the server serves on, still in the router
    assert [w["id"] for w in router.workers()] == ids
    d.start()
    status = d.status()
    assert status["server"]["pid"] == pid and status["router"]["registered"] is True
    assert [w["id"] for w in router.workers()] == ids  # the same registration, not a new one
    d.env.clear()
    assert d.stop() == 0
    d.start()  # without keep mode the daemon's exit takes the server out of the router
    wait_until(lambda: worker_urls(router) == [me], 30, 0.1, "the router to list the server")
    assert d.stop() == 0
    assert router.workers() == []
