"""``GET /history`` and /status's ``diagnosis`` on a real ``serve --simulate`` daemon."""

from __future__ import annotations

from typing import Any

from tests.helpers import Daemon, wait_until


def test_history_and_diagnosis_are_served(readonly_daemon: Daemon) -> None:
    d = readonly_daemon
    status = d.status()
    diagnosis = status["diagnosis"]
    assert diagnosis["kind"] in ("not_saturated", "no_metrics"), diagnosis
    assert diagnosis["since"] > 1.7e9 and "message" in diagnosis

    def sampled() -> dict[str, Any] | None:
        body: dict[str, Any] = d.client.get("/history").json()
        return body if len(body["t"]) >= 2 else None

    body = wait_until(sampled, 30, 0.5, "two history samples")
    assert body["interval_s"] == 2.0 and body["max_samples"] == 1800
    for column in body["columns"]:
        assert len(body[column]) == len(body["t"]), column
    assert body["t"] == sorted(body["t"])
    newer = d.client.get("/history", params={"since": body["t"][-2]}).json()
    assert newer["t"] and newer["t"][0] == body["t"][-1]
    r = d.client.get("/history", params={"limit": "5"})
    assert r.status_code == 422 and "limit" in r.text
    # Absurd or non-finite times are refused, not answered with an empty history.
    for bad in ("nan", "inf", "-inf", "1e309", "1e308", str(body["t"][-1] * 1000)):
        r = d.client.get("/history", params={"since": bad})
        assert r.status_code == 422 and "since" in r.text, (bad, r.text)
    r = d.client.get("/history", params={"since": str(body["t"][-1] * 1000)})
    assert "seconds (not milliseconds)" in r.text, r.text
