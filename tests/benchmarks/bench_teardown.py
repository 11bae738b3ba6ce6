"""Teardown: stop -> every GPU verified released, through the supervisor vs a bare SIGKILL.

The tree: the simulated server with ``--tp-size 8`` (launcher + 8 ranks + detokenizer =
10 processes, each rank holding 0.85 × 140 GiB of a simulated H200), start-up 0 s.
Methods, alternated within every repetition (the order rotates):

* ``supervisor``: ``sglang_supervisor.host.teardown.teardown`` (the staged stop: SIGTERM to the
  launcher alone, up to ``stop_grace_s`` for it to drain and exit, then SIGTERM to the
  members left, then SIGKILL) then ``sglang_supervisor.host.gpu.wait_released`` on ``SimGpuProbe``,
  both with the daemon's defaults (``TimeoutSettings``: grace, ``release_samples``
  consecutive clean samples ``release_interval_s`` apart, ``release_tolerance_mib``) —
  what a stop costs in the daemon, minus HTTP and bookkeeping;
* ``supervisor, grace 0, 1 sample``: the same with ``grace_s=0`` (a forced stop: SIGKILL
  right after the SIGTERMs) and ``consecutive=1``: the mechanism alone, without the
  server's graceful exit and the repeated verification samples;
* ``daemon POST /stop?wait=true``: a real daemon (production timeouts), client wall time;
* ``bare SIGKILL``: ``killpg(SIGKILL)`` of the launcher's group, then poll every 1 ms
  until every process of the tree (snapshotted before the signal) has truly exited.
  For the simulated GPUs that is exactly when the memory is free: the physical limit.
* ``bare SIGTERM``: the same with SIGTERM to the group (the supervisor's stop before the
  staged order): the ranks die of it at once, like SGLang's schedulers, and the launcher
  follows; on real SGLang that cuts every request in flight.
* ``bare SIGTERM to the launcher``: ``kill(launcher, SIGTERM)`` alone, then the same wait:
  the simulated server's own graceful exit (SGLang's: it looks at its requests every 5 s,
  ``SGLANG_SIM_DRAIN_CHECK_S``, here SGLang's 5 s), which the supervisor's staged stop
  cannot be faster than.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from sglang_supervisor.host import process, teardown
from sglang_supervisor.host.gpu import wait_released
from tests.benchmarks.common import (
    PRODUCTION,
    Context,
    Result,
    SimHost,
    Table,
    bare_server,
    ms,
    new_daemon,
    ratio,
    reap,
    running,
    sim_argv,
    spread_ms,
    summary,
    tree_pids,
    wait_gone,
    wait_http_ok,
)
from tests.helpers import free_port

NAME = "teardown"
TP = 8
TOLERANCE_BYTES = PRODUCTION.release_tolerance_mib * 2**20
SAMPLES = PRODUCTION.release_samples
INTERVAL_S = PRODUCTION.release_interval_s

SUP = f"supervisor (grace {PRODUCTION.stop_grace_s:g} s, {SAMPLES} samples)"
SUP0 = "supervisor, grace 0, 1 sample"
DAEMON = "daemon POST /stop?wait=true"
BARE = "bare SIGKILL + wait gone"
BARE_TERM = "bare SIGTERM + wait gone"
BARE_LAUNCHER = "bare SIGTERM to the launcher + wait gone"


def _supervisor(
    ctx: Context, host: SimHost, grace_s: float, samples: int, interval_s: float
) -> dict[str, Any]:
    port = free_port()
    tag = ctx.new_tag("teardown")
    log = ctx.work / f"{tag}.log"
    launch = process.spawn(sim_argv(port, TP), host.env(), tag=tag, log_path=log)
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health_generate", 60)
        held = host.used_bytes()
        t0 = time.monotonic()
        report = teardown.teardown(launch, tag=tag, grace_s=grace_s, kill_timeout_s=30)
        t_exit = time.monotonic()
        verdict = wait_released(
            host.probe,
            list(range(host.gpus)),
            dict.fromkeys(range(host.gpus), 0),
            lambda: report.members,
            timeout_s=30,
            tolerance_bytes=TOLERANCE_BYTES,
            consecutive=samples,
            interval_s=interval_s,
        )
        t1 = time.monotonic()
    finally:
        if process.find_members(launch, tag=tag):
            teardown.teardown(launch, tag=tag, grace_s=0, kill_timeout_s=10)
    assert verdict.released, verdict.describe()
    return {
        "total_s": t1 - t0,
        "exit_s": t_exit - t0,
        "teardown_exit_s": report.exit_s,
        "release_s": verdict.elapsed_s,
        "release_samples": verdict.samples,
        "members": len(report.members),
        "sigkill_sent": len(report.sigkill_sent),
        "held_gib": held / 2**30,
        "left_bytes": host.used_bytes(),
    }


def _bare(
    ctx: Context, host: SimHost, sig: signal.Signals, *, launcher_only: bool = False
) -> dict[str, Any]:
    port = free_port()
    tag = ctx.new_tag("bare")
    with bare_server(host, port, log=ctx.work / f"{tag}.log", tp=TP, tag=tag) as popen:
        wait_http_ok(f"http://127.0.0.1:{port}/health_generate", 60)
        pids = tree_pids(popen.pid)
        t0 = time.monotonic()
        if launcher_only:
            os.kill(popen.pid, sig)
        else:
            os.killpg(popen.pid, sig)
        t1 = wait_gone(pids, 30.0, 0.001)
        reap(pids)
        assert t1 is not None, "the bare tree did not exit within 30 s"
        return {"total_s": t1 - t0, "members": len(pids), "left_bytes": host.used_bytes()}


def _daemon_stop(d: Any) -> dict[str, Any]:
    if d.status()["state"] != "ready":
        r = d.client.post("/start", params={"wait": "true"})
        r.raise_for_status()
        d.wait_state("ready", timeout=60)
    members = len(d.status()["gpus"])
    t0 = time.monotonic()
    r = d.client.post("/stop", params={"wait": "true"})
    t1 = time.monotonic()
    r.raise_for_status()
    op = r.json()["operation"]
    assert op["state"] == "succeeded", op
    phases = {p["name"]: p["duration_s"] for p in op["phases"]}
    return {
        "total_s": t1 - t0,
        "op_s": op["duration_s"],
        "stop_s": phases.get("stop"),
        "release_s": phases.get("release"),
        "gpus": members,
        "left_bytes": sum(d.gpu_used()),
    }


def _median(rs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rs if r.get(key) is not None]
    return summary(values)["median"] if values else None


def run(ctx: Context) -> Result:
    reps = ctx.reps(7, 5)
    host = SimHost(ctx.subdir("teardown") / "sim-gpus", gpus=TP)
    d = new_daemon(ctx, "teardown-daemon", gpus=TP)
    methods = [SUP, SUP0, DAEMON, BARE_LAUNCHER, BARE_TERM, BARE]
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    with running(d):
        for i in range(reps):
            for m in methods[i % len(methods) :] + methods[: i % len(methods)]:
                if m == SUP:
                    runs[m].append(
                        _supervisor(ctx, host, PRODUCTION.stop_grace_s, SAMPLES, INTERVAL_S)
                    )
                elif m == SUP0:
                    runs[m].append(_supervisor(ctx, host, 0.0, 1, INTERVAL_S))
                elif m == DAEMON:
                    runs[m].append(_daemon_stop(d))
                elif m == BARE_TERM:
                    runs[m].append(_bare(ctx, host, signal.SIGTERM))
                elif m == BARE_LAUNCHER:
                    runs[m].append(_bare(ctx, host, signal.SIGTERM, launcher_only=True))
                else:
                    runs[m].append(_bare(ctx, host, signal.SIGKILL))

    med = {m: _median(rs, "total_s") for m, rs in runs.items()}
    rows = []
    for m, rs in runs.items():
        tot = [r["total_s"] for r in rs]
        gone = _median(rs, "exit_s") if m in (SUP, SUP0) else _median(rs, "stop_s")
        rows.append(
            [
                m,
                str(len(tot)),
                ms(med[m]),
                spread_ms(tot),
                ms(gone),
                ms(_median(rs, "release_s")),
                ratio(med[m], med[BARE]),
                ratio(med[m], med[BARE_TERM]),
                ratio(med[m], med[BARE_LAUNCHER]),
                str(max(r["left_bytes"] for r in rs)),
            ]
        )
    table = Table(
        f"Teardown of the simulated tp=8 tree (10 processes): stop -> all 8 GPUs released, "
        f"{reps} alternating repetitions (ms)",
        [
            "method",
            "n",
            "median",
            "min–max",
            "signal → members gone",
            "release verification",
            "ratio to bare SIGKILL",
            "ratio to bare SIGTERM",
            "ratio to bare SIGTERM to the launcher",
            "sim bytes left",
        ],
        rows,
        note="signal → members gone: teardown's return (supervisor) or the stop phase (daemon); "
        "release verification: wait_released's time, or the daemon's release phase.",
    )
    sup, sup0, dmn, bare, term, launcher = (
        med[m] or 0.0 for m in (SUP, SUP0, DAEMON, BARE, BARE_TERM, BARE_LAUNCHER)
    )
    sup_gone = _median(runs[SUP], "exit_s") or 0.0
    sup_rel = _median(runs[SUP], "release_s") or 0.0
    met = sup / bare <= 1.1
    findings = [
        f"Through the supervisor (the staged stop, {SAMPLES} verification samples) a stop "
        f"costs {sup * 1000:.0f} ms median against {bare * 1000:.0f} ms for a bare SIGKILL of "
        f"the group (ratio {sup / bare:.1f}; goal 1.1: {'met' if met else 'missed'}), "
        f"{launcher * 1000:.0f} ms for a bare SIGTERM to the launcher alone (ratio "
        f"{sup / launcher:.2f}: the server's own graceful exit, the floor of the staged stop) "
        f"and {term * 1000:.0f} ms for a bare SIGTERM to the group (ratio {sup / term:.1f}); "
        f"through the daemon's POST /stop?wait=true {dmn * 1000:.0f} ms.",
        f"The members' exit after the launcher's SIGTERM takes {sup_gone * 1000:.0f} ms: the "
        "launcher notices it at its next drain check (SGLang's sigterm_watchdog looks every "
        "5 s, tokenizer_manager.py:3508-3548; the simulated server's beats count from its "
        "start), finds no request and ends its ranks. A SIGTERM to the group is faster only "
        "because it kills the ranks outright, which on real SGLang cuts every request in "
        f"flight. Release verification: {sup_rel * 1000:.0f} ms (release_samples={SAMPLES} "
        f"consecutive clean samples release_interval_s={INTERVAL_S:g} apart).",
        f"The mechanism alone (grace 0: SIGKILL right after the SIGTERMs, one sample) costs "
        f"{sup0 * 1000:.0f} ms vs {bare * 1000:.0f} ms bare: teardown makes full /proc scans "
        "(before the first signal, before the members' SIGTERM, before SIGKILL, to confirm; "
        "2-20 ms each on this loaded 2-CPU host) and polls every poll_s=0.02 s.",
    ]
    return Result(
        NAME,
        "Teardown vs a bare SIGKILL (simulated tree)",
        "ratio ≤ 1.1 (supervisor vs bare SIGKILL)",
        [table],
        {"repetitions": reps, "runs": runs, "medians_s": med},
        findings,
        "met" if met else "missed",
    )
