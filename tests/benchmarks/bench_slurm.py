"""Two-node server through Slurm: ``python -m tests.benchmarks.bench_slurm [--runs N]``.

Needs the two-node test cluster (``scripts/slurm-cluster.sh start DIR``, then
``SGLANG_SUPERVISOR_TEST_SLURM_CONF=DIR/etc/slurm.conf``). The simulated server,
``tp_size 16, nnodes 2``, 8 simulated GPUs per node, fast simulated load (0.2 s) and
health (0.05 s). In ONE allocation, interleaved run by run (daemon, bare, daemon, bare...:
the machine's load falls on both alike), each ``--runs`` times (median, min, max):

* ``daemon_apply_s``: a lever change through the daemon (``POST /levers?wait=true``:
  validate, preflight on every node, leader-first stop, every node's release verified,
  a new step, ready on the leader, probation, commit), with ``--probation-s`` (0 by
  default: the engine's own cost; the issue's target is on that);
* ``bare_restart_s``: the same server restarted by hand as a bare Slurm step with the
  same staged stop: SIGTERM to node 0's task alone (the leader drains and broadcasts the
  shutdown), the step's end, ``srun`` again, until the leader's ``/health_generate``
  answers 200: no validation, no release check, no probation;
* ``group_recovery_s``: a rank SIGKILLed on the second node until the daemon reports the
  whole group ready again (a new step);
* ``stuck_noticed_s`` / ``stuck_ready_s``: every process of the server's task on the
  second node SIGSTOPped, until the daemon leaves ``ready`` / has a new group ready.

Node names come from the allocation (``scontrol show hostnames``). Results go to
``tests/benchmarks/results/slurm.json`` (``--no-save``: not written).
"""

from __future__ import annotations

import argparse
import contextlib
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

from sglang_supervisor.sim.gpus import sim_gpu_uuid
from tests.conftest import FAST_SIM_ENV
from tests.helpers import TAG_ENV, Daemon, free_port, tagged_processes, wait_until
from tests.slurm.test_slurm_daemon import slurm_daemon
from tests.slurmkit import SlurmCluster, find_cluster, node_processes

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


def allocation_nodes(cluster: SlurmCluster, job: str) -> list[str]:
    """The allocation's nodes in Slurm's order (node 0 first)."""
    shown = cluster.run(["squeue", "-h", "-j", job, "-o", "%N"]).stdout.strip()
    return cluster.run(["scontrol", "show", "hostnames", shown]).stdout.split()


class Bare:
    """The same simulated group as a bare step, restarted by hand with the staged stop."""

    def __init__(self, cluster: SlurmCluster, job: str, nodes: list[str], tmp: Path) -> None:
        self.cluster, self.nodes = cluster, nodes
        registry = tmp / "bare-gpus"
        for node in nodes:
            (registry / node).mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.tag = f"sgs-bench-bare-{os.getpid()}"
        visible = ",".join(f"{n}/{sim_gpu_uuid(i)}" for n in nodes for i in range(8))
        self.argv = [
            "srun", "--overlap", f"--jobid={job}", f"--nodes={len(nodes)}",
            "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}", "--kill-on-bad-exit=1",
            f"--job-name={self.tag}",
            sys.executable, "-m", "sglang_supervisor.slurm.task", "--",
            sys.executable, "-m", "sglang_supervisor.sim.server", "--model-path", "sim/llama",
            "--tp-size", "16", "--nnodes", str(len(nodes)), "--host", "127.0.0.1",
            "--port", str(port), "--dist-init-addr", f"localhost:{free_port()}",
            "--enable-metrics",
        ]  # fmt: skip
        # The daemon's simulated server: [sim] startup_s 0.2, health_s 0.05 (tests.helpers).
        self.env = cluster.env(
            **{
                **FAST_SIM_ENV,
                "SGLANG_SIM_GPU_DIR": str(registry),
                "SGLANG_SIM_GPU_DIR_PER_NODE": "1",
                "SGLANG_SIM_STARTUP_S": "0.2",
                "SGLANG_SIM_HEALTH_S": "0.05",
                "CUDA_VISIBLE_DEVICES": visible,
                TAG_ENV: self.tag,
            }
        )
        self.srun: subprocess.Popen[bytes] | None = None

    def launch(self) -> None:
        self.srun = subprocess.Popen(
            self.argv, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_until(lambda: healthy(self.url), 120, 0.02, "the bare step ready")

    def stop(self) -> None:
        """SIGTERM to node 0's task alone (a child of slurmstepd), then the step's end."""
        assert self.srun is not None
        for p in node_processes(self.tag, self.nodes[0]):
            with contextlib.suppress(psutil.Error):
                parent = p.parent()
                if parent is not None and parent.name().startswith("slurmstepd"):
                    p.terminate()
        self.srun.wait(120)

    def restart(self) -> float:
        t0 = time.monotonic()
        self.stop()
        self.launch()
        return time.monotonic() - t0

    def close(self) -> None:
        if self.srun is not None and self.srun.poll() is None:
            self.srun.kill()
            self.srun.wait(60)


def recovery(d: Daemon, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        before = d.wait_state("ready")
        victim = before["gpus"][12]["processes"][0]["pid"]  # a rank on the second node
        t0 = time.monotonic()
        psutil.Process(victim).kill()
        wait_until(lambda tag=before["server"]["launch_tag"]: _back(d, tag), 120, 0.05, "back")
        times.append(time.monotonic() - t0)
    return times


def _back(d: Daemon, tag: str) -> bool:
    s = d.status_or_none()
    return bool(
        s and s["state"] == "ready" and s["operation"] is None and s["server"]["launch_tag"] != tag
    )


def stuck(d: Daemon, node: str, runs: int) -> tuple[list[float], list[float]]:
    noticed, ready = [], []
    for _ in range(runs):
        tag = d.wait_state("ready")["server"]["launch_tag"]
        frozen = node_processes(tag, node)
        t0 = time.monotonic()
        for p in frozen:
            p.suspend()
        try:
            wait_until(lambda: (d.status_or_none() or {}).get("state") != "ready", 120, 0.02)
            noticed.append(time.monotonic() - t0)
            wait_until(lambda tag=tag: _back(d, tag), 120, 0.05, "a new group")
            ready.append(time.monotonic() - t0)
        finally:
            for p in frozen:
                with contextlib.suppress(psutil.Error):
                    p.resume()
    return noticed, ready


def measure(cluster: SlurmCluster, job: str, tmp: Path, ns: argparse.Namespace) -> dict[str, Any]:
    nodes = allocation_nodes(cluster, job)
    # Every recovery is measured: no crash-loop verdict in between.
    d = slurm_daemon(
        cluster,
        job,
        tmp / "daemon",
        LEVERS,
        gpus=8,
        timeouts={"crash_loop_count": 100, "probation_s": ns.probation_s},
        slurm={"stuck_after_s": ns.stuck_after_s},
    )
    bare = Bare(cluster, job, nodes, tmp)
    raw: dict[str, list[float]] = {"daemon_apply_s": [], "bare_restart_s": []}
    try:
        d.start()
        bare.launch()
        for i in range(ns.runs):  # interleaved: daemon, bare, daemon, bare...
            t0 = time.monotonic()
            op = d.apply({"mem_fraction_static": 0.8 if i % 2 == 0 else 0.85}).json()
            raw["daemon_apply_s"].append(time.monotonic() - t0)
            assert op["operation"]["state"] == "succeeded", op
            raw["bare_restart_s"].append(bare.restart())
        bare.close()
        raw["group_recovery_s"] = recovery(d, ns.runs)
        raw["stuck_noticed_s"], raw["stuck_ready_s"] = stuck(d, nodes[1], ns.runs)
        for op in d.client.get("/operations").json()["operations"]:
            if op["kind"] == "apply":  # where an apply's time went, phase by phase
                took = {ph["name"]: ph["duration_s"] for ph in op["phases"]}
                print(f"apply {op['id']}: {op['duration_s']}s {took}", file=sys.stderr)
    finally:
        bare.close()
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        d.client.close()
        left = [p.pid for p in tagged_processes(d.instance)]
        if left:
            print(f"note: the daemon left processes running: {left}", file=sys.stderr)
    return raw


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.bench_slurm")
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--probation-s", type=float, default=0.0)
    p.add_argument("--stuck-after-s", type=float, default=2.0)
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
        raw = measure(cluster, job, Path(tmp), ns)
    record: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
            "python": platform.python_version(),
        },
        "server": "simulated, tp_size 16, nnodes 2, 8 GPUs per node, two slurmd on one host",
        "runs": ns.runs,
        "probation_s": ns.probation_s,
        "stuck_after_s": ns.stuck_after_s,
        "summary": {k: summary(v) for k, v in raw.items()},
        "raw": {k: [round(x, 3) for x in v] for k, v in raw.items()},
    }
    ratio = (
        record["summary"]["daemon_apply_s"]["median"]
        / record["summary"]["bare_restart_s"]["median"]
    )
    record["apply_vs_bare_ratio"] = round(ratio, 2)
    pairs = [a / b for a, b in zip(raw["daemon_apply_s"], raw["bare_restart_s"], strict=True)]
    record["apply_vs_bare_ratio_per_pair"] = summary(pairs)
    print(json.dumps(record, indent=2))
    if not ns.no_save:
        RESULTS.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
