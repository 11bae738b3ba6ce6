"""The daemon's /metrics beyond the server's figures: which operation runs (alerts leave
planned work out by it), the build, the daemon process itself."""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sglang_supervisor.version import version
from tests.helpers import Daemon, wait_until


def samples(d: Daemon, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = d.client.get("/metrics").text
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def running_kinds(d: Daemon) -> set[str]:
    return {
        dict(k)["kind"] for k, v in samples(d, "sglang_supervisor_operation_running").items() if v
    }


def test_operation_running_build_info_and_process_metrics(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory().start()
    assert running_kinds(d) == set()
    kinds = {dict(k)["kind"] for k in samples(d, "sglang_supervisor_operation_running")}
    assert {"apply", "start", "stop", "restart", "recover"} <= kinds
    result: dict[str, Any] = {}

    def apply() -> None:  # a 2 s model load: long enough to be seen running
        r = d.apply({"mem_fraction_static": 0.88}, env={"SGLANG_SIM_STARTUP_S": "2"})
        result.update(r.json())

    t = threading.Thread(target=apply)
    t.start()
    try:
        wait_until(lambda: running_kinds(d) == {"apply"}, 20, 0.05, "operation_running apply=1")
    finally:
        t.join(60)
    assert result["operation"]["state"] == "succeeded", result
    assert running_kinds(d) == set()
    # A dry run is not work on the server.
    assert d.apply({"mem_fraction_static": 0.8}, dry_run=True).status_code == 200
    assert running_kinds(d) == set()

    build = samples(d, "sglang_supervisor_build_info")
    assert len(build) == 1 and dict(next(iter(build)))["version"] == version()
    rss = samples(d, "sglang_supervisor_process_resident_memory_bytes")
    assert rss and next(iter(rss.values())) > 10 * 2**20
