"""Orphans: the same simulated server tree stopped by supervisord and by this daemon.

supervisord (PyPI ``supervisor``) must live in a virtual environment of its own — its
import name is also ours::

    python3 -m venv /tmp/supervisord-venv && /tmp/supervisord-venv/bin/pip install supervisor

(``SUPERVISORD_VENV`` names another one). Cases, as ``SGLANG_SIM_FAULTS`` of the
simulated server (``--tp-size 4``: launcher + 4 ranks + detokenizer):

* plain — every process obeys SIGTERM;
* ``ignore_sigterm`` — the launcher and every child ignore SIGTERM;
* ``detach_ranks`` — ranks and the detokenizer call ``setsid()`` (leave the group);
* ``ignore_sigterm,detach_ranks`` — both.

Stoppers: supervisord with its default program section (only command, directory,
environment and log set: ``stopsignal=TERM``, ``stopasgroup=false``, ``killasgroup=false``),
supervisord with ``stopasgroup=true`` and ``killasgroup=true``, and this daemon's
``POST /stop?wait=true``. supervisord's ``stopwaitsecs`` and the daemon's ``stop_grace_s``
are equal (10 s, supervisord's default; 2 s with ``--quick``). After the stop returns and
one more second, the processes still carrying the launch tag (``SGLANG_SUPERVISOR_INSTANCE``
in ``/proc/<pid>/environ``) and the simulated GPU bytes still held are counted. Everything
left is killed afterwards (and counted as such).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sglang_supervisor.sim.gpus import SimGpuProbe
from tests.benchmarks.common import (
    Context,
    Result,
    SimHost,
    Table,
    kill_tagged,
    new_daemon,
    running,
    sim_argv,
    tagged_alive,
    wait_http_ok,
)
from tests.helpers import free_port

NAME = "orphans"
TP = 4
CASES = [
    ("plain", ""),
    ("ranks ignore SIGTERM", "ignore_sigterm"),
    ("ranks setsid", "detach_ranks"),
    ("ignore SIGTERM + setsid", "ignore_sigterm,detach_ranks"),
]
SD_DEFAULT = "supervisord, default program config"
SD_GROUP = "supervisord, stopasgroup+killasgroup"
OURS = "sglang-supervisor POST /stop"
SETTLE_S = 1.0


def supervisord_bin() -> Path | None:
    venv = Path(os.environ.get("SUPERVISORD_VENV", "/tmp/supervisord-venv"))
    path = venv / "bin" / "supervisord"
    return path if path.exists() else None


def _sd_env(host: SimHost, faults: str, tag: str) -> str:
    env = host.env(faults=faults, tag=tag)
    keep = {k: env[k] for k in env if k.startswith(("SGLANG_", "CUDA_"))}
    return ",".join(f'{k}="{v}"' for k, v in sorted(keep.items()))


def _sd_config(work: Path, argv: list[str], environment: str, wait_s: float, group: bool) -> Path:
    program = [
        "[program:sglang]",
        "command=" + " ".join(argv),
        f"directory={Path.cwd()}",
        f"environment={environment}",
        "redirect_stderr=true",
        f"stdout_logfile={work / 'sglang.log'}",
    ]
    if wait_s != 10:
        program.append(f"stopwaitsecs={wait_s:g}")
    if group:
        program += ["stopasgroup=true", "killasgroup=true"]
    text = "\n".join(
        [
            "[unix_http_server]",
            f"file={work / 'sd.sock'}",
            "[supervisord]",
            f"logfile={work / 'supervisord.log'}",
            f"pidfile={work / 'supervisord.pid'}",
            f"childlogdir={work}",
            "nodaemon=true",
            "[rpcinterface:supervisor]",
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
            "[supervisorctl]",
            f"serverurl=unix://{work / 'sd.sock'}",
            *program,
            "",
        ]
    )
    conf = work / "supervisord.conf"
    conf.write_text(text)
    return conf


def _ctl(sd: Path, conf: Path, *args: str, timeout: float = 120) -> tuple[float, str]:
    t0 = time.monotonic()
    out = subprocess.run(
        [str(sd.with_name("supervisorctl")), "-c", str(conf), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_clean_env(),
    )
    return time.monotonic() - t0, (out.stdout + out.stderr).strip()


def _clean_env() -> dict[str, str]:
    # supervisord imports a module named ``supervisor``: never let it see ours.
    return {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SGLANG_SUPERVISOR_INSTANCE")
    }


def _under_supervisord(
    ctx: Context, sd: Path, faults: str, group: bool, wait_s: float
) -> dict[str, Any]:
    work = ctx.subdir("supervisord")
    host = SimHost(work / "sim-gpus", gpus=TP)
    tag = ctx.new_tag("supervisord")
    port = free_port()
    conf = _sd_config(work, sim_argv(port, TP), _sd_env(host, faults, tag), wait_s, group)
    daemon = subprocess.Popen(
        [str(sd), "-c", str(conf)],
        cwd=work,
        env=_clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/health_generate", 60, 0.01)
        before = len(tagged_alive(tag))
        held_before = host.used_bytes()
        stop_s, out = _ctl(sd, conf, "stop", "sglang")
        time.sleep(SETTLE_S)
        left = tagged_alive(tag)
        held = host.used_bytes()
    finally:
        with contextlib.suppress(Exception):
            _ctl(sd, conf, "shutdown", timeout=60)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(10)
        killed = kill_tagged(tag)
    return {
        "members_before": before,
        "held_before_bytes": held_before,
        "stop_s": stop_s,
        "supervisorctl": out,
        "left_alive": len(left),
        "left_bytes": held,
        "killed_in_cleanup": len(killed),
        "bytes_after_cleanup": host.used_bytes(),
    }


def _under_daemon(ctx: Context, faults: str, wait_s: float) -> dict[str, Any]:
    d = new_daemon(
        ctx,
        "orphans-daemon",
        gpus=TP,
        timeouts={"stop_grace_s": wait_s},
        env={"SGLANG_SIM_FAULTS": faults} if faults else None,
    )
    prefix = d.instance + "."
    probe = SimGpuProbe(d.dir / "state" / "sim-gpus", count=TP)
    with running(d):
        before = len(tagged_alive(prefix))
        held_before = sum(d.gpu_used())
        t0 = time.monotonic()
        r = d.client.post("/stop", params={"wait": "true"})
        stop_s = time.monotonic() - t0
        r.raise_for_status()
        op = r.json()["operation"]
        time.sleep(SETTLE_S)
        left = tagged_alive(prefix)
        held = sum(s.memory_used_bytes for s in probe.sample(list(range(TP))))
    killed = kill_tagged(prefix)
    return {
        "members_before": before,
        "held_before_bytes": held_before,
        "stop_s": stop_s,
        "operation_state": op["state"],
        "phases": {p["name"]: p["detail"] for p in op["phases"]},
        "left_alive": len(left),
        "left_bytes": held,
        "killed_in_cleanup": len(killed),
    }


def run(ctx: Context) -> Result:
    wait_s = 2.0 if ctx.quick else 10.0
    sd = supervisord_bin()
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for case, faults in CASES:
        per: dict[str, dict[str, Any]] = {}
        if sd is not None:
            per[SD_DEFAULT] = _under_supervisord(ctx, sd, faults, group=False, wait_s=wait_s)
            per[SD_GROUP] = _under_supervisord(ctx, sd, faults, group=True, wait_s=wait_s)
        per[OURS] = _under_daemon(ctx, faults, wait_s)
        results[case] = per

    tables = []
    for case, faults in CASES:
        rows = []
        for who, r in results[case].items():
            rows.append(
                [
                    who,
                    str(r["members_before"]),
                    f"{r['stop_s']:.2f}",
                    str(r["left_alive"]),
                    f"{r['left_bytes'] / 2**30:.1f}",
                ]
            )
        tables.append(
            Table(
                f"Case: {case} (SGLANG_SIM_FAULTS={faults or '(none)'}), tp=4",
                [
                    "stopped by",
                    "processes before",
                    "stop took (s)",
                    "processes left alive",
                    "simulated GPU GiB still held",
                ],
                rows,
            )
        )
    findings = []
    n = len(CASES)
    for who in results[CASES[0][0]]:
        bad = [c for c, _ in CASES if results[c][who]["left_alive"]]
        held = max((results[c][who]["left_bytes"] for c in bad), default=0)
        findings.append(
            f"{who}: processes left alive in {len(bad)} of {n} cases"
            + (f" ({', '.join(bad)}; up to {held / 2**30:.0f} GiB held)" if bad else "")
        )
    findings = ["; ".join(findings) + "."]
    if sd is None:
        findings.append(
            "supervisord is not installed (python3 -m venv /tmp/supervisord-venv && "
            "/tmp/supervisord-venv/bin/pip install supervisor): only this daemon was measured."
        )
    findings.append(
        "Why: supervisord signals only the program's pid (default) or its process group "
        "(stopasgroup/killasgroup); ranks that ignore SIGTERM outlive the launcher's SIGKILL, "
        "and ranks that called setsid are outside the group. sglang-supervisor finds members by "
        "group, descendants and the launch tag in their environment, and SIGKILLs each."
    )
    ours_clean = all(
        results[c][OURS]["left_alive"] == 0 and results[c][OURS]["left_bytes"] == 0
        for c, _ in CASES
    )
    return Result(
        NAME,
        "Orphans left by a stop: supervisord vs sglang-supervisor",
        "0 processes and 0 bytes left in every case",
        tables,
        {
            "stop_wait_s": wait_s,
            "supervisord": None if sd is None else str(sd),
            "tp_size": TP,
            "results": results,
        },
        findings,
        "met" if ours_clean else "missed",
    )


if __name__ == "__main__":  # pragma: no cover - a convenience
    sys.exit("run it through: python -m tests.benchmarks.run --only orphans")
