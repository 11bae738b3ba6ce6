"""What an operator watches: /metrics, /logs, /events — after an apply, a rollback, a crash."""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import Daemon, wait_until

PREFIX = "sglang_supervisor_"


def scrape(d: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = d.client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        assert family.name.startswith(PREFIX), family.name
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(
    m: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float | None:
    return m.get((PREFIX + name, tuple(sorted(labels.items()))))


def test_metrics_after_an_apply(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory().start()
    assert d.apply({"mem_fraction_static": 0.9}).json()["operation"]["state"] == "succeeded"
    m = scrape(d)
    assert value(m, "state", state="ready") == 1 and value(m, "state", state="stopped") == 0
    assert value(m, "server_up") == 1
    assert value(m, "operations_total", kind="apply", outcome="succeeded") == 1
    for phase in ("validate", "preflight", "stop", "release", "start", "probation", "commit"):
        assert value(m, "phase_duration_seconds_count", phase=phase) >= 1, phase
    assert value(m, "phase_duration_seconds_bucket", phase="start", le="1800.0") is not None
    assert value(m, "last_successful_apply_timestamp_seconds") is not None
    status = d.status()
    for g in status["gpus"]:
        gpu = str(g["index"])
        assert value(m, "gpu_memory_total_bytes", gpu=gpu) == g["memory_total_bytes"]
        assert value(m, "gpu_memory_used_bytes", gpu=gpu) == g["memory_used_bytes"]
        assert value(m, "gpu_memory_baseline_bytes", gpu=gpu) == 0
    assert value(m, "server_max_total_num_tokens") == status["server"]["max_total_num_tokens"]
    # Bounded labels only: no pid, no flag string.
    for name, labels in m:
        if name == PREFIX + "build_info":  # one series: the version is its whole point
            assert set(dict(labels)) == {"version", "python_version"}
            continue
        # The effect's verdict (9 values) and window (before, after): bounded too.
        allowed = {"state", "gpu", "kind", "outcome", "phase", "reason", "le", "verdict", "window"}
        assert set(dict(labels)) <= allowed


def test_rollback_counts_and_logs_show_the_oom(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory().start()
    op = d.apply({"mem_fraction_static": 0.99}).json()["operation"]
    assert op["state"] == "rolled_back"

    # The daemon's view (hence /metrics) catches up with the operation's end a moment later.
    def counted() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        m = scrape(d)
        return m if value(m, "operations_total", kind="apply", outcome="rolled_back") == 1 else None

    m = wait_until(counted, 10, 0.05, "the rollback counted in /metrics")
    assert value(m, "phase_duration_seconds_count", phase="start") == 3  # first, failed, rollback
    # The failed launch is the one before the current: its log shows the OOM.
    failed = d.client.get("/logs", params={"tail": 20, "launch": 1})
    assert failed.status_code == 200 and "CUDA out of memory" in failed.text
    current = d.client.get("/logs", params={"tail": 5})
    assert "CUDA out of memory" not in current.text
    assert d.client.get("/logs", params={"launch": 99}).status_code == 404


def test_crash_is_counted_as_a_restart(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory().start()
    pid = d.status()["server"]["pid"]
    os.kill(pid, signal.SIGKILL)
    # Counted when the recovery operation has ended, a moment after the ready transition.
    wait_until(
        lambda: (
            (s := d.status())["state"] == "ready"
            and s["server"]["pid"] != pid
            and s["operation"] is None
        ),
        30,
        0.05,
        "the restart",
    )
    m = scrape(d)
    assert value(m, "restarts_total", reason="crash") == 1
    assert value(m, "operations_total", kind="recover", outcome="succeeded") == 1


def test_event_stream_shows_the_phases_in_order(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory().start()
    events: list[dict[str, Any]] = []
    connected = threading.Event()
    done = threading.Event()

    def listen() -> None:
        with (
            httpx.Client(base_url=d.url, timeout=30, trust_env=False) as c,
            c.stream("GET", "/events") as r,
        ):
            for line in r.iter_lines():
                if line.startswith(":"):
                    connected.set()
                if line.startswith("data: "):
                    ev = json.loads(line[6:])
                    events.append(ev)
                    if ev["kind"] == "operation" and ev["state"] != "running":
                        done.set()
                        return

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    assert connected.wait(10)
    d.apply({"mem_fraction_static": 0.9}, wait=False)
    assert done.wait(30), events
    ended = [e["name"] for e in events if e["kind"] == "phase" and e["state"] != "running"]
    assert ended == ["validate", "preflight", "stop", "release", "start", "probation", "commit"]
    kinds = [e["kind"] for e in events]
    assert "release_sample" in kinds and "launch" in kinds and "teardown" in kinds
    transitions = [(e["old"], e["new"]) for e in events if e["kind"] == "transition"]
    assert transitions == [
        ("ready", "stopping"),
        ("stopping", "releasing"),
        ("releasing", "stopped"),
        ("stopped", "starting"),
        ("starting", "ready"),
    ]
    samples = [e for e in events if e["kind"] == "release_sample"]
    assert all(len(e["gpus"]) == 4 for e in samples)
    assert all(g["memory_used_bytes"] == 0 for g in samples[-1]["gpus"])
