"""Footprint: the daemon's RSS and CPU share while idle, with its polling on.

A real daemon (``serve --simulate``, 8 simulated GPUs, ``--tp-size 8``) with the
production timeouts: the liveness probe (``/health_generate``) every
``liveness_interval_s = 10`` s, the telemetry scrape of the server's ``/metrics`` every
2 s (built in), and, from the harness, a Prometheus-like scrape of the daemon's own
``/metrics`` every 15 s. Once the server is ready and 3 s have passed, the daemon process
alone (not the server it manages) is sampled with psutil once a second for 60 s (15 s with
``--quick``): CPU time used over wall time = share of one core; RSS (and USS at the end).
Goals: RSS ≤ 100 MB, CPU ≤ 0.5 % of a core.
"""

from __future__ import annotations

import time

import psutil

from tests.benchmarks.common import Context, Result, Table, new_daemon, running

NAME = "footprint"
GPUS = 8
SCRAPE_S = 15.0
RSS_GOAL = 100 * 10**6
CPU_GOAL = 0.5


def run(ctx: Context) -> Result:
    window_s = 5.0 if ctx.smoke else 15.0 if ctx.quick else 60.0
    liveness_s = 10.0
    d = new_daemon(ctx, "footprint-daemon", gpus=GPUS, timeouts={"liveness_interval_s": liveness_s})
    with running(d):
        assert d.proc is not None
        proc = psutil.Process(d.proc.pid)
        time.sleep(3.0)
        server_log = d.status()["server"]["log_path"]
        probes_before = _count_probes(server_log)
        rss: list[int] = []
        c0 = proc.cpu_times()
        t0 = time.monotonic()
        next_scrape = t0
        scrapes = 0
        while (now := time.monotonic()) < t0 + window_s:
            if now >= next_scrape:
                d.client.get("/metrics").raise_for_status()
                scrapes += 1
                next_scrape += SCRAPE_S
            rss.append(proc.memory_info().rss)
            time.sleep(min(1.0, max(0.0, t0 + window_s - time.monotonic())))
        c1 = proc.cpu_times()
        wall = time.monotonic() - t0
        full = proc.memory_full_info()
        threads = proc.num_threads()
        probes = _count_probes(server_log) - probes_before
        # The same daemon with no server: its own loops only (no liveness, no telemetry).
        d.client.post("/stop", params={"wait": "true"}).raise_for_status()
        time.sleep(2.0)
        stopped_s = window_s / 2
        s0 = proc.cpu_times()
        ts = time.monotonic()
        time.sleep(stopped_s)
        s1 = proc.cpu_times()
        stopped_pct = (
            100.0 * ((s1.user - s0.user) + (s1.system - s0.system)) / (time.monotonic() - ts)
        )
    cpu_s = (c1.user - c0.user) + (c1.system - c0.system)
    cpu_pct = 100.0 * cpu_s / wall
    rss_max = max(rss)
    table = Table(
        f"Daemon footprint over {wall:.0f} s idle (server ready, {GPUS} simulated GPUs)",
        [
            "RSS max (MB)",
            "RSS at end (MB)",
            "USS at end (MB)",
            "CPU (% of one core)",
            "CPU seconds",
            "threads",
            "liveness probes",
            "/metrics scrapes",
            "CPU % with no server",
        ],
        [
            [
                f"{rss_max / 1e6:.1f}",
                f"{full.rss / 1e6:.1f}",
                f"{full.uss / 1e6:.1f}",
                f"{cpu_pct:.2f}",
                f"{cpu_s:.2f}",
                str(threads),
                str(probes),
                str(scrapes),
                f"{stopped_pct:.2f}",
            ]
        ],
        note=f"Liveness every {liveness_s:g} s, telemetry every 2 s, external scrape every "
        f"{SCRAPE_S:g} s. 'liveness probes' counts /health_generate requests in the server's log. "
        "'CPU % with no server': the same daemon after POST /stop, over half the window: its "
        "own loops only.",
    )
    met = rss_max <= RSS_GOAL and cpu_pct <= CPU_GOAL
    findings = [
        f"RSS {rss_max / 1e6:.0f} MB max (goal ≤ 100 MB: "
        + ("met" if rss_max <= RSS_GOAL else "missed")
        + f"); CPU {cpu_pct:.2f} % of one core (goal ≤ 0.5 %: "
        + ("met" if cpu_pct <= CPU_GOAL else "missed")
        + ").",
        f"With the server stopped (no liveness probe, no telemetry scrape) the daemon still uses "
        f"{stopped_pct:.2f} % of a core: timers that wake every 0.1 s — uvicorn's own main-loop "
        "tick and the Supervisor's watch ticker (poll_s=0.1, supervisor/engine/watch.py). "
        "The telemetry scrape of the server's /metrics every 2 s and the liveness probe add "
        f"the other {cpu_pct - stopped_pct:.2f} %.",
    ]
    return Result(
        NAME,
        "Daemon footprint while idle",
        "RSS ≤ 100 MB, CPU ≤ 0.5 % of a core",
        [table],
        {
            "window_s": wall,
            "rss_bytes": rss,
            "uss_bytes": full.uss,
            "cpu_s": cpu_s,
            "cpu_percent_of_core": cpu_pct,
            "threads": threads,
            "liveness_probes": probes,
            "scrapes": scrapes,
            "cpu_percent_of_core_no_server": stopped_pct,
        },
        findings,
        "met" if met else "missed",
    )


def _count_probes(log_path: str) -> int:
    try:
        with open(log_path, errors="replace") as f:
            return sum(1 for line in f if "GET /health_generate" in line)
    except OSError:
        return 0
