"""Two-node server through Slurm: ``python -m tests.benchmarks.bench_slurm [--runs N]``.

Needs the two-node test cluster (``scripts/slurm-cluster.sh start DIR``, then
``SGLANG_SUPERVISOR_TEST_SLURM_CONF=DIR/etc/slurm.conf``). The simulated server,
``tp_size 16, nnodes 2``, 8 simulated GPUs per node, fast simulated load (0.2 s) and
health (0.05 s), measures, each ``--runs`` times (median, min, max):

* ``daemon_apply_s``: a lever change through the daemon (``POST /levers?wait=true``:
  validate, preflight on every node, leader-first stop, every node's release verified,
  a new step, ready on the leader, probation 0.5 s, commit);
* ``bare_restart_s``: the same server restarted by hand as a bare Slurm step
  (``scancel -s KILL`` of the step, ``srun`` again, until the leader's
  ``/health_generate`` answers): no drain, no release verification, no probation;
* ``group_recovery_s``: a rank SIGKILLed on the second node until the daemon reports the
  whole group ready again (a new step).

Results go to ``tests/benchmarks/results/slurm.json`` (``--no-save``: not written).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.conftest import FAST_SIM_ENV
from tests.helpers import free_port, tagged_processes, wait_until
from tests.slurm.test_slurm_daemon import slurm_daemon
from tests.slurmkit import SlurmCluster, find_cluster

RESULTS = Path(__file__).resolve().parent / "results" / "slurm.json"
LEVERS = {"tp_size": 16, "nnodes": 2}


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def healthy(url: str) -> bool:
    try:
        r = httpx.get(f"{url}/health_generate", timeout=2, trust_env=False)
        return r.status_code == 200
    except httpx.HTTPError:
        return False


def measure_daemon(cluster: SlurmCluster, job: str, tmp: Path, runs: int) -> dict[str, Any]:
    # Every recovery is measured: no crash-loop verdict in between.
    d = slurm_daemon(cluster, job, tmp, LEVERS, gpus=8, timeouts={"crash_loop_count": 100})
    applies: list[float] = []
    recoveries: list[float] = []
    try:
        d.start()
        for i in range(runs):
            t0 = time.monotonic()
            op = d.apply({"mem_fraction_static": 0.8 if i % 2 == 0 else 0.85}).json()
            applies.append(time.monotonic() - t0)
            assert op["operation"]["state"] == "succeeded", op
        for _ in range(runs):
            before = d.wait_state("ready")
            victim = before["gpus"][12]["processes"][0]["pid"]  # a rank on n2
            t0 = time.monotonic()
            psutil.Process(victim).kill()
            tag = before["server"]["launch_tag"]

            def back(tag: str = tag) -> bool:
                s = d.status_or_none()
                return bool(
                    s
                    and s["state"] == "ready"
                    and s["operation"] is None
                    and s["server"]["launch_tag"] != tag
                )

            wait_until(back, 120, 0.05, "the group back")
            recoveries.append(time.monotonic() - t0)
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        d.client.close()
        left = [p.pid for p in tagged_processes(d.instance)]
        if left:
            print(f"note: the daemon left processes running: {left}", file=sys.stderr)
    return {"daemon_apply_s": applies, "group_recovery_s": recoveries}


def measure_bare(cluster: SlurmCluster, job: str, tmp: Path, runs: int) -> list[float]:
    """The same simulated group as a bare step, restarted by hand."""
    registry = tmp / "bare-gpus"
    for node in ("n1", "n2"):
        (registry / node).mkdir(parents=True, exist_ok=True)
    port = free_port()
    visible = ",".join(
        f"{n}/GPU-00000000-5151-4000-8000-{i:012x}" for n in ("n1", "n2") for i in range(8)
    )
    name = f"sgs-bench-bare-{os.getpid()}"
    argv = [
        "srun", "--overlap", f"--jobid={job}", "-N2", "--ntasks-per-node=1",
        "--kill-on-bad-exit=1", f"--job-name={name}",
        sys.executable, "-m", "sglang_supervisor.slurm.task", "--",
        sys.executable, "-m", "sglang_supervisor.sim.server", "--model-path", "sim/llama",
        "--tp-size", "16", "--nnodes", "2", "--host", "127.0.0.1", "--port", str(port),
        "--dist-init-addr", f"localhost:{free_port()}", "--enable-metrics",
    ]  # fmt: skip
    env = cluster.env(
        SGLANG_SIM_GPU_DIR=str(registry),
        SGLANG_SIM_GPU_DIR_PER_NODE="1",
        SGLANG_SIM_STARTUP_S="0.2",
        CUDA_VISIBLE_DEVICES=visible,
        **FAST_SIM_ENV,
    )
    url = f"http://127.0.0.1:{port}"

    def launch() -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def step_ids() -> list[str]:
        out = cluster.run(["squeue", "-h", "-s", "-j", job, "-o", "%i %j"]).stdout
        return [ln.split()[0] for ln in out.splitlines() if ln.split()[1:] == [name]]

    srun = launch()
    times: list[float] = []
    try:
        wait_until(lambda: healthy(url), 120, 0.05, "the bare step's first start")
        for _ in range(runs):
            t0 = time.monotonic()
            for step in step_ids():
                cluster.run(["scancel", "-s", "KILL", step])
            srun.wait(60)
            srun = launch()
            wait_until(lambda: healthy(url), 120, 0.02, "the bare step ready again")
            times.append(time.monotonic() - t0)
    finally:
        for step in step_ids():
            cluster.run(["scancel", "-s", "KILL", step])
        srun.wait(60)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.bench_slurm")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-save", action="store_true")
    ns = p.parse_args(argv)
    for k, v in FAST_SIM_ENV.items():
        os.environ.setdefault(k, v)
    cluster = find_cluster()
    with (
        tempfile.TemporaryDirectory(prefix="sgs-bench-slurm-") as tmp,
        cluster.allocation(2) as job,
    ):
        (Path(tmp) / "daemon").mkdir()
        daemon = measure_daemon(cluster, job, Path(tmp) / "daemon", ns.runs)
        bare = measure_bare(cluster, job, Path(tmp), ns.runs)
    raw: dict[str, list[float]] = {**daemon, "bare_restart_s": bare}
    record: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
            "python": platform.python_version(),
        },
        "server": "simulated, tp_size 16, nnodes 2, 8 GPUs per node, two slurmd on one host",
        "runs": ns.runs,
        "summary": {k: summary(v) for k, v in raw.items()},
        "raw": {k: [round(x, 3) for x in v] for k, v in raw.items()},
    }
    ratio = (
        record["summary"]["daemon_apply_s"]["median"]
        / record["summary"]["bare_restart_s"]["median"]
    )
    record["apply_vs_bare_ratio"] = round(ratio, 2)
    print(json.dumps(record, indent=2))
    if not ns.no_save:
        RESULTS.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
