"""API under load: ``GET /status`` with 50 concurrent loopback clients, idle and during an
apply; ``GET /metrics`` with 8 GPUs.

A real daemon (``serve --simulate``, 8 simulated GPUs, ``--tp-size 8``, production timeouts,
``probation_s = 0``, simulated model load 2 s so that an apply lasts a few seconds). The
load is 50 threads of the harness, each with its own ``httpx.Client`` connection, each
sending its next request as soon as the last one answered; latency is measured by the
client (so it includes the client's own scheduling, on the same CPUs as the daemon).
Bounded: a fixed number of requests idle; during the apply, requests until the operation
ends (at most 60 s). ``/metrics`` is fetched sequentially by one client. Goal for
/metrics: ≤ 20 ms median.

Sequential requests on one kept-alive connection (what Prometheus, the CLI's follower and
browsers do) against a new connection per request: a kept-alive answer must not be slower
(a response written in two segments with Nagle on waits ~40 ms for the client's delayed
ACK: that was 44 ms per kept-alive ``/healthz`` against 3 ms on new connections).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

import httpx

from tests.benchmarks.common import (
    Context,
    Result,
    Table,
    new_daemon,
    ratio,
    running,
    summary,
)
from tests.helpers import Daemon

NAME = "api"
CLIENTS = 50
GPUS = 8
STARTUP_S = 2.0
METRICS_GOAL_S = 0.020


class Load:
    """``clients`` threads, each with its own connection, sending GET /status back to back."""

    def __init__(self, url: str, clients: int, per_client: int | None) -> None:
        self.url, self.per_client = url, per_client
        self.samples: list[tuple[float, float, str]] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(clients)]

    def _worker(self) -> None:
        n = 0
        with httpx.Client(base_url=self.url, timeout=30, trust_env=False) as c:
            while (self.per_client is None or n < self.per_client) and not self.stop.is_set():
                t = time.monotonic()
                try:
                    code = str(c.get("/status").status_code)
                except httpx.HTTPError as exc:
                    code = type(exc).__name__
                with self._lock:
                    self.samples.append((t, time.monotonic() - t, code))
                n += 1

    def start(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def join(self, timeout_s: float) -> list[tuple[float, float, str]]:
        """Wait for the workers (at most ``timeout_s``, then stop them); every sample."""
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.stop.set()
        for t in self._threads:
            t.join(35)
        with self._lock:
            return list(self.samples)


def _during_apply(d: Daemon, fraction: float) -> dict[str, Any]:
    load = Load(d.url, CLIENTS, None).start()
    time.sleep(1.0)  # the load is running before the apply starts
    t0 = time.monotonic()
    r = d.client.post("/levers", json={"levers": {"mem_fraction_static": fraction}})
    r.raise_for_status()
    op_id = r.json()["operation"]["id"]
    op: dict[str, Any] = {}
    while time.monotonic() < t0 + 60:
        op = d.client.get(f"/operations/{op_id}").json()["operation"]
        if op["state"] != "running":
            break
        time.sleep(0.05)
    t1 = time.monotonic()
    load.stop.set()
    samples = load.join(60)
    window = [(lat, code) for t, lat, code in samples if t0 <= t <= t1]
    return {
        "apply_s": t1 - t0,
        "apply_state": op.get("state"),
        "op_s": op.get("duration_s"),
        "latencies_s": [lat for lat, code in window if code == "200"],
        "codes": _count(code for _, code in window),
    }


def _count(codes: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for code in codes:
        out[code] = out.get(code, 0) + 1
    return out


def _sequential(d: Daemon, path: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.monotonic()
        r = d.client.get(path)
        out.append(time.monotonic() - t)
        r.raise_for_status()
    return out


def _timed_get(c: httpx.Client, path: str) -> float:
    t = time.monotonic()
    c.get(path).raise_for_status()
    return time.monotonic() - t


def _kept_alive_table(d: Daemon, n: int) -> tuple[Table, dict[str, Any]]:
    """Sequential requests on one kept-alive connection vs a new connection each,
    alternating (so both see the same load on a shared machine)."""
    rows, data = [], {}
    no_reuse = httpx.Limits(max_keepalive_connections=0)
    for path in ("/healthz", "/status", "/metrics"):
        with (
            httpx.Client(base_url=d.url, timeout=30, trust_env=False) as kept,
            httpx.Client(base_url=d.url, timeout=30, trust_env=False, limits=no_reuse) as new,
        ):
            kept.get(path).raise_for_status()  # the connection is open before timing
            lat_kept, lat_new = [], []
            for _ in range(n):
                lat_kept.append(_timed_get(kept, path))
                lat_new.append(_timed_get(new, path))
        k, c = summary(lat_kept), summary(lat_new)
        data[path] = {"kept_alive_s": k, "new_connection_s": c}
        rows.append(
            [
                path,
                str(k["n"]),
                f"{k['median'] * 1000:.1f}",
                f"{k['p99'] * 1000:.1f}",
                f"{c['median'] * 1000:.1f}",
                ratio(k["median"], c["median"]),
            ]
        )
    table = Table(
        "Sequential requests: one kept-alive connection vs a new connection each (ms)",
        ["path", "requests", "kept-alive p50", "kept-alive p99", "new-connection p50", "ratio"],
        rows,
        note="Goal: a kept-alive request is no slower than one on a new connection (ratio ≤ 1.0).",
    )
    return table, data


def _apply_alone(d: Daemon, fraction: float) -> float:
    t0 = time.monotonic()
    r = d.apply({"mem_fraction_static": fraction})
    r.raise_for_status()
    assert r.json()["operation"]["state"] == "succeeded", r.text
    return time.monotonic() - t0


def _row(label: str, lat: list[float], base: dict[str, float] | None) -> list[str]:
    s = summary(lat)
    return [
        label,
        str(s["n"]),
        f"{s['median'] * 1000:.1f}",
        f"{s['p99'] * 1000:.1f}",
        f"{s['min'] * 1000:.1f}–{s['max'] * 1000:.1f}",
        "1.00" if base is None else ratio(s["median"], base["median"]),
        "1.00" if base is None else ratio(s["p99"], base["p99"]),
    ]


def run(ctx: Context) -> Result:
    per_client = ctx.reps(40, 10)
    metrics_n = ctx.reps(300, 100)
    d = new_daemon(
        ctx, "api-daemon", gpus=GPUS, timeouts={"probation_s": 0.0}, sim={"startup_s": STARTUP_S}
    )
    with running(d):
        metrics_idle = _sequential(d, "/metrics", metrics_n)
        status_seq = _sequential(d, "/status", metrics_n)
        t3, kept_alive = _kept_alive_table(d, ctx.reps(200, 50))
        idle = Load(d.url, CLIENTS, per_client).start().join(300)
        apply_alone_s = _apply_alone(d, 0.86)
        during = _during_apply(d, 0.85)
        sample = d.client.get("/metrics").text
    idle_lat = [lat for _, lat, code in idle if code == "200"]
    idle_codes = _count(code for _, _, code in idle)
    base = summary(idle_lat)
    t1 = Table(
        f"GET /status, {CLIENTS} concurrent loopback clients, {GPUS} simulated GPUs (ms)",
        ["when", "requests", "p50", "p99", "min–max", "p50 ratio", "p99 ratio"],
        [
            _row("one sequential client (service time)", status_seq, None),
            _row("idle (server ready)", idle_lat, None),
            _row("during an apply", during["latencies_s"], base),
        ],
        note=f"The apply took {during['apply_s']:.2f} s under this load, {apply_alone_s:.2f} s "
        f"without it (simulated model load {STARTUP_S:g} s). Answers: idle {idle_codes}, "
        f"during {during['codes']}. Ratios are to the idle row.",
    )
    m = summary(metrics_idle)
    t2 = Table(
        f"GET /metrics, one sequential client, {GPUS} simulated GPUs (ms)",
        ["requests", "median", "p99", "min–max", "body bytes"],
        [
            [
                str(m["n"]),
                f"{m['median'] * 1000:.1f}",
                f"{m['p99'] * 1000:.1f}",
                f"{m['min'] * 1000:.1f}–{m['max'] * 1000:.1f}",
                str(len(sample.encode())),
            ]
        ],
    )
    d_s = summary(during["latencies_s"])
    errors = sum(n for code, n in [*idle_codes.items(), *during["codes"].items()] if code != "200")
    findings = [
        f"/status with {CLIENTS} concurrent clients: p50 {base['median'] * 1000:.0f} ms, p99 "
        f"{base['p99'] * 1000:.0f} ms idle; during an apply p50 {d_s['median'] * 1000:.0f} ms, "
        f"p99 {d_s['p99'] * 1000:.0f} ms (ratios {d_s['median'] / base['median']:.2f} and "
        f"{d_s['p99'] / base['p99']:.2f}); {errors} failed requests. One sequential client: "
        f"p50 {summary(status_seq)['median'] * 1000:.1f} ms per /status.",
        f"/metrics with {GPUS} GPUs: median {m['median'] * 1000:.1f} ms (goal ≤ 20 ms: "
        + ("met" if m["median"] <= METRICS_GOAL_S else "missed")
        + ").",
    ]
    kept_ok = all(
        v["kept_alive_s"]["median"] <= v["new_connection_s"]["median"] for v in kept_alive.values()
    )
    findings.append(
        "Kept-alive sequential requests, p50: "
        + ", ".join(
            f"{path} {v['kept_alive_s']['median'] * 1000:.1f} ms "
            f"(new connection {v['new_connection_s']['median'] * 1000:.1f} ms)"
            for path, v in kept_alive.items()
        )
        + (": no slower than new connections." if kept_ok else ": SLOWER than new connections.")
    )
    ok = m["median"] <= METRICS_GOAL_S and errors == 0 and kept_ok
    return Result(
        NAME,
        "API under load",
        "/status answers during an apply (p50/p99 ratio reported); /metrics ≤ 20 ms median; "
        "kept-alive requests no slower than new connections",
        [t1, t2, t3],
        {
            "clients": CLIENTS,
            "gpus": GPUS,
            "status_sequential_s": summary(status_seq),
            "status_idle_s": summary(idle_lat),
            "answers_idle": idle_codes,
            "answers_during_apply": during["codes"],
            "status_during_apply_s": d_s,
            "apply_under_load_s": during["apply_s"],
            "apply_alone_s": apply_alone_s,
            "apply_state": during["apply_state"],
            "metrics_s": m,
            "kept_alive": kept_alive,
            "status_idle_latencies_s": [round(x, 5) for x in idle_lat],
            "status_during_latencies_s": [round(x, 5) for x in during["latencies_s"]],
        },
        findings,
        "met" if ok else "missed",
    )
