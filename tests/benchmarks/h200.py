"""Real-GPU benchmark: the supervisor stopping a torch stand-in server vs the physical limit.

Runs on a host with an NVIDIA GPU, torch with CUDA, nvidia-ml-py, psutil, httpx and pydantic
(the Supervisor core needs it)::

    python -m tests.benchmarks.h200 --out DIR [--budget-s 450] [--grace-s 2]
    python -m tests.benchmarks.h200 --out DIR --dry-run    # no GPU: simulated ranks

The stand-in (``tests/benchmarks/h200_standin.py``): an HTTP launcher and 4 torch rank
children holding 30 GiB each on one GPU; rank 0 ignores SIGTERM and pins host memory
(8 GiB and 48 GiB: two cases). Per case, alternating, the same tree is stopped

* by the supervisor: ``sglang_supervisor.host.teardown.teardown`` (SIGTERM to the group and every
member,
  SIGKILL after ``--grace-s``) then ``sglang_supervisor.host.gpu.wait_released`` on ``NvmlProbe``
  with the daemon's defaults (``TimeoutSettings``: release_samples consecutive clean
  samples release_interval_s apart, release_tolerance_mib);
* by a bare script: ``killpg(SIGKILL)``, then wait until NVML shows the memory free and
  every process has truly exited: the physical limit.

A monitor thread samples NVML (used memory) and ``/proc`` (which pids have truly exited)
every 5 ms, so each run reports signal -> SIGKILL -> exit -> NVML free -> release verdict.
Last, one swap through the Supervisor core (the apply transaction, with the stand-in as
its backend): 30 -> 25 GiB per rank, NVML sampled every 10 ms for the memory plot.
Results: ``DIR/h200_results.json`` (rewritten after every run) and
``DIR/h200_swap_samples.json``; ``python -m tests.benchmarks.h200_report`` turns them into
the Markdown table and the PNG.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

from sglang_supervisor.host import process, teardown
from sglang_supervisor.host.gpu import GpuInfo, GpuProbe, GpuQueryError, wait_released

GIB = 2**30
STANDIN = Path(__file__).with_name("h200_standin.py")
TAG_PREFIX = "sgs-bench-h200"
RANKS = 4
GIB_PER_RANK = 30.0
CASES = [("4x30GiB+pin8GiB", 8.0), ("4x30GiB+pin48GiB", 48.0)]


def truly_gone(pid: int) -> bool:
    """No /proc entry, or a zombie whose last thread has exited."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2].split()[0]
        return state in (b"Z", b"X") and len(os.listdir(f"/proc/{pid}/task")) <= 1
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


class Monitor:
    """Every ``interval_s``: NVML used bytes of one GPU, and when each pid truly exited."""

    def __init__(self, probe: GpuProbe, index: int, pids: list[int], interval_s: float) -> None:
        self.probe, self.index, self.pids, self.interval_s = probe, index, pids, interval_s
        self.samples: list[tuple[float, int]] = []
        self.gone_at: dict[int, float] = {}
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            for pid in self.pids:
                if pid not in self.gone_at and truly_gone(pid):
                    self.gone_at[pid] = now
            try:
                used = self.probe.sample([self.index])[0].memory_used_bytes
            except GpuQueryError:
                self.errors += 1
            else:
                self.samples.append((time.monotonic(), used))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def free_at(self, limit: int, after: float) -> float | None:
        return next((t for t, used in self.samples if t >= after and used <= limit), None)

    def all_gone_at(self) -> float | None:
        if set(self.gone_at) != set(self.pids):
            return None
        return max(self.gone_at.values())


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out
        self.t_start = time.monotonic()
        self.work = Path(tempfile.mkdtemp(prefix="h200-bench-"))
        self.results: dict[str, Any] = {"meta": {}, "runs": [], "swap": None, "errors": []}
        self.probe, self.gpu, self.cuda_env = self._probe()
        from sglang_supervisor.config import TimeoutSettings

        #: The daemon's defaults: release samples, their interval, the tolerance.
        self.timeouts = TimeoutSettings()
        self.tolerance = self.timeouts.release_tolerance_mib * 2**20

    # -- set-up ------------------------------------------------------------------------

    def _probe(self) -> tuple[GpuProbe, GpuInfo, dict[str, str]]:
        if self.args.dry_run:
            from sglang_supervisor.sim.gpus import SimGpuProbe, sim_gpu_uuid

            registry = self.work / "sim-gpus"
            registry.mkdir()
            self.sim_registry = str(registry)
            probe: GpuProbe = SimGpuProbe(registry, count=1)
            gpu = probe.devices()[0]
            return probe, gpu, {"CUDA_VISIBLE_DEVICES": sim_gpu_uuid(0)}
        from sglang_supervisor.host.gpu import cuda_visible_devices
        from sglang_supervisor.host.nvml import NvmlProbe

        self.sim_registry = ""
        probe = NvmlProbe()
        gpu = probe.devices()[int(os.environ.get("SUPERVISOR_TEST_GPU", "0"))]
        return probe, gpu, cuda_visible_devices([gpu])[1]

    def left_s(self) -> float:
        return float(self.args.budget_s) - (time.monotonic() - self.t_start)

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / ".h200_results.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1))
        os.replace(tmp, self.out / "h200_results.json")

    def env(self, pin_gib: float) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != process.TAG_ENV}
        env.update(self.cuda_env)
        env.update(self.standin_env(pin_gib, self.args.gib))
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def standin_env(self, pin_gib: float, gib: float) -> dict[str, str]:
        env = {
            "SGLANG_STANDIN_RANKS": str(RANKS),
            "SGLANG_STANDIN_GIB": f"{gib:g}",
            "SGLANG_STANDIN_PIN_GIB": f"{pin_gib:g}",
            "SGLANG_STANDIN_PIN_RANK": "0",
            "SGLANG_STANDIN_IGNORE_SIGTERM": "0",
        }
        if self.sim_registry:
            env["SGLANG_STANDIN_SIM_REGISTRY"] = self.sim_registry
        return env

    def meta(self) -> None:
        m: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "dry_run": self.args.dry_run,
            "grace_s": self.args.grace_s,
            "gpu": self.gpu.name,
            "gpu_memory_total_mib": self.gpu.memory_total_bytes // 2**20,
            "python": platform.python_version(),
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "ram_gib": round(psutil.virtual_memory().total / GIB, 1),
            "psutil": psutil.__version__,
            "pid_ns": os.readlink("/proc/self/ns/pid"),
            "pids_are_local": self.probe.pids_are_local(),
            "tolerance_mib": self.timeouts.release_tolerance_mib,
            "release_samples": self.timeouts.release_samples,
            "release_interval_s": self.timeouts.release_interval_s,
            "readiness_poll_s": self.timeouts.readiness_poll_s,
            "ranks": RANKS,
            "gib_per_rank": self.args.gib,
        }
        with contextlib.suppress(Exception):
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            m["nvidia_smi"] = out.stdout.strip()
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            m["torch"] = version("torch")
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            m["nvidia-ml-py"] = version("nvidia-ml-py")
        times = []
        for _ in range(300):
            t = time.perf_counter()
            self.probe.sample([self.gpu.index])
            times.append(time.perf_counter() - t)
        times.sort()
        m["probe_sample_median_us"] = round(times[len(times) // 2] * 1e6, 1)
        m["probe_sample_p99_us"] = round(times[int(len(times) * 0.99)] * 1e6, 1)
        self.results["meta"] = m
        self.save()
        print("META", json.dumps(m), flush=True)

    # -- one stand-in ------------------------------------------------------------------

    def used(self) -> int:
        return self.probe.sample([self.gpu.index])[0].memory_used_bytes

    def _wait_ready(self, port: int, pid_alive: Any, baseline: int, log: Path) -> float:
        import httpx

        t0 = time.monotonic()
        deadline = t0 + 300
        url = f"http://127.0.0.1:{port}/health_generate"
        need = baseline + int(RANKS * self.args.gib * GIB * 0.99)
        with httpx.Client(trust_env=False) as client:
            while time.monotonic() < deadline:
                if not pid_alive():
                    raise RuntimeError(f"stand-in exited before ready:\n{log.read_text()[-3000:]}")
                try:
                    ok = client.get(url, timeout=2).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok and self.used() >= need:
                    return time.monotonic() - t0
                time.sleep(0.05)
        raise RuntimeError(f"stand-in not ready in 300 s:\n{log.read_text()[-3000:]}")

    def run_once(self, case: str, pin_gib: float, method: str, rep: int) -> dict[str, Any]:
        port = _free_port()
        tag = f"{TAG_PREFIX}-{uuid.uuid4().hex[:8]}"
        log = self.work / f"{case}-{method}-{rep}.log"
        argv = [sys.executable, str(STANDIN), "--host", "127.0.0.1", "--port", str(port)]
        env = self.env(pin_gib)
        baseline = self.used()
        launch: process.Launch | None = None
        popen: subprocess.Popen[bytes] | None = None
        if method == "supervisor":
            launch = process.spawn(argv, env, tag=tag, log_path=log)
            alive = lambda: not launch.poll()  # noqa: E731
            leader = launch.pid
        else:
            with open(log, "ab") as f:
                popen = subprocess.Popen(
                    argv,
                    env={**env, process.TAG_ENV: tag},
                    stdin=subprocess.DEVNULL,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            alive = lambda: popen.poll() is None  # noqa: E731
            leader = popen.pid
        rec: dict[str, Any] = {"case": case, "pin_gib": pin_gib, "method": method, "rep": rep}
        try:
            rec["ready_s"] = round(self._wait_ready(port, alive, baseline, log), 3)
            held = self.used() - baseline
            ranks = _rank_pids(port)
            pids = [leader, *ranks]
            rec["tree_processes"] = 1 + len(psutil.Process(leader).children(recursive=True))
            rec["members"] = len(pids)
            rec["held_mib"] = held // 2**20
            rec["baseline_mib"] = baseline // 2**20
            limit = baseline + self.tolerance
            if method == "supervisor":
                assert launch is not None
                rec.update(self._supervisor_stop(launch, tag, pids, ranks, limit, baseline))
            else:
                assert popen is not None
                rec.update(self._bare_stop(popen, pids, limit))
        finally:
            left = process.find_members(launch, tag=tag)
            if left:
                rec["cleanup_killed"] = sorted(left)
                teardown.teardown(launch, tag=tag, grace_s=0, kill_timeout_s=60)
            if popen is not None:
                with contextlib.suppress(OSError):
                    os.killpg(popen.pid, signal.SIGKILL)
                popen.wait(60)
        rec["log_tail"] = log.read_text(errors="replace").splitlines()[-5:]
        return rec

    def _supervisor_stop(
        self,
        launch: process.Launch,
        tag: str,
        pids: list[int],
        ranks: list[int],
        limit: int,
        baseline: int,
    ) -> dict[str, Any]:
        started: list[float] = []

        def clock() -> float:
            now = time.monotonic()
            if not started:
                started.append(now)  # teardown's first clock read: just before SIGTERM
            return now

        with Monitor(self.probe, self.gpu.index, pids, 0.005) as mon:
            report = teardown.teardown(
                launch, tag=tag, grace_s=self.args.grace_s, kill_timeout_s=120, clock=clock
            )
            t_down = time.monotonic()
            verdict = wait_released(
                self.probe,
                [self.gpu.index],
                {self.gpu.index: baseline},
                lambda: report.members,
                timeout_s=180,
                tolerance_bytes=self.tolerance,
                consecutive=self.timeouts.release_samples,
                interval_s=self.timeouts.release_interval_s,
            )
            t_verdict = time.monotonic()
        t0 = started[0]
        free = mon.free_at(limit, t0)
        gone = mon.all_gone_at()
        obeying = [mon.gone_at[p] for p in ranks[1:] if p in mon.gone_at]  # rank 0 ignores
        return {
            "sigterm_to_sigkill_s": _r(report.kill_after_s),
            "teardown_exit_s": _r(report.exit_s),
            "sigterm_to_true_exit_s": _r(None if gone is None else gone - t0),
            "sigterm_to_obeying_ranks_gone_s": _r(max(obeying) - t0 if obeying else None),
            "sigterm_to_nvml_free_s": _r(None if free is None else free - t0),
            "sigterm_to_teardown_return_s": _r(t_down - t0),
            "sigterm_to_verdict_s": _r(t_verdict - t0),
            "verdict_released": verdict.released,
            "verdict_samples": verdict.samples,
            "sigkill_sent_to": [_label(pid, pids[0], ranks) for pid in report.sigkill_sent],
            "survivors": [s.describe() for s in report.survivors],
            "monitor_samples": len(mon.samples),
            "monitor_errors": mon.errors,
        }

    def _bare_stop(
        self, popen: subprocess.Popen[bytes], pids: list[int], limit: int
    ) -> dict[str, Any]:
        with Monitor(self.probe, self.gpu.index, pids, 0.005) as mon:
            t0 = time.monotonic()
            os.killpg(popen.pid, signal.SIGKILL)
            deadline = t0 + 180
            while time.monotonic() < deadline:
                for pid in pids:
                    with contextlib.suppress(ChildProcessError, OSError):
                        os.waitpid(pid, os.WNOHANG)
                if mon.all_gone_at() is not None and mon.free_at(limit, t0) is not None:
                    break
                time.sleep(0.001)
        free = mon.free_at(limit, t0)
        gone = mon.all_gone_at()
        return {
            "sigkill_to_true_exit_s": _r(None if gone is None else gone - t0),
            "sigkill_to_nvml_free_s": _r(None if free is None else free - t0),
            "monitor_samples": len(mon.samples),
            "monitor_errors": mon.errors,
        }

    # -- the cases ---------------------------------------------------------------------

    def teardown_cases(self) -> None:
        for case, pin in CASES:
            reps = self.args.reps8 if pin < 16 else self.args.reps48
            # A run of this case costs about: start + stop (pinned memory slows both).
            estimate = 15 + 0.8 * pin
            for rep in range(reps):
                order = ["supervisor", "bare"] if rep % 2 == 0 else ["bare", "supervisor"]
                for method in order:
                    if self.left_s() < estimate + self.args.reserve_s:
                        msg = f"skipped {case} {method} rep {rep}: {self.left_s():.0f}s left"
                        print(msg, flush=True)
                        self.results["errors"].append(msg)
                        continue
                    t = time.monotonic()
                    try:
                        rec = self.run_once(case, pin, method, rep)
                    except Exception as exc:  # keep going: the next run may work
                        rec = {"case": case, "method": method, "rep": rep, "error": repr(exc)}
                    rec["wall_s"] = round(time.monotonic() - t, 1)
                    self.results["runs"].append(rec)
                    self.save()
                    print("RUN", json.dumps(rec), flush=True)

    # -- one swap through the Supervisor core ------------------------------------------

    def swap(self) -> None:
        if self.left_s() < 45:
            self.results["errors"].append(f"swap skipped: {self.left_s():.0f}s left")
            return
        try:
            self.results["swap"] = asyncio.run(self._swap())
        except Exception as exc:
            import traceback

            traceback.print_exc()
            self.results["swap"] = {"error": repr(exc)}
        self.save()

    async def _swap(self) -> dict[str, Any]:
        from sglang_supervisor.config import ServerSettings, Settings, TimeoutSettings
        from sglang_supervisor.engine import Supervisor
        from sglang_supervisor.host.backend import Backend
        from sglang_supervisor.observe.health import HttpHealthChecker
        from sglang_supervisor.runtime import OsProcessOps
        from sglang_supervisor.sglang.schema import load_bundled
        from sglang_supervisor.states import ServerState
        from sglang_supervisor.store import Store

        port = _free_port()
        first = self.standin_env(8.0, self.args.gib)
        second = self.standin_env(8.0, 25.0)
        settings = Settings(
            simulate=False,
            state_dir=self.work / "swap-state",
            instance=f"{TAG_PREFIX}-swap",
            server=ServerSettings(
                python=sys.executable,
                host="127.0.0.1",
                port=port,
                gpus=[self.gpu.uuid],
                levers={"model_path": "standin", "tp_size": 1},
                env=first,
            ),
            timeouts=TimeoutSettings(
                stop_grace_s=self.args.grace_s,
                kill_timeout_s=60,
                release_timeout_s=120,
                ready_timeout_s=300,
                probation_s=0,
            ),
        )
        env = dict(self.cuda_env)
        env["PYTHONUNBUFFERED"] = "1"
        backend = Backend(
            name="standin", command=[sys.executable, str(STANDIN)], probe=self.probe, env=env
        )
        sup = Supervisor(
            settings,
            backend=backend,
            procs=OsProcessOps(),
            health=HttpHealthChecker(),
            schema=load_bundled(),
            store=Store(settings.state_dir),
        )
        await sup.start()
        assert sup.operation is not None
        await asyncio.wait_for(sup.operation.done.wait(), 400)
        if sup.state != ServerState.READY:
            raise RuntimeError(f"the stand-in did not start: {sup.state_reason}")
        old_pids = sorted(process.find_members(None, tag_prefix=sup.tag_prefix))
        old_ranks = _rank_pids(port)
        samples: list[dict[str, Any]] = []
        stop = threading.Event()
        index = self.gpu.index

        def sampler() -> None:
            while not stop.is_set():
                try:
                    s = self.probe.sample([index])[0]
                except GpuQueryError:
                    continue
                samples.append(
                    {
                        "t": time.time(),
                        "used": s.memory_used_bytes,
                        "procs": {str(p.pid): p.used_bytes for p in s.processes},
                    }
                )
                stop.wait(0.01)

        thread = threading.Thread(target=sampler, daemon=True)
        thread.start()
        await asyncio.sleep(0.5)
        t_submit = time.time()
        op = await sup.submit_apply({}, second)
        await asyncio.wait_for(op.done.wait(), 400)
        t_done = time.time()
        new_pids = sorted(process.find_members(None, tag_prefix=sup.tag_prefix))
        new_ranks = _rank_pids(port) if op.state == "succeeded" else []
        await asyncio.sleep(0.5)
        stop.set()
        thread.join(5)
        result = {
            "t_submit": t_submit,
            "t_done": t_done,
            "operation": op.to_json(),
            "old_pids": old_pids,
            "new_pids": new_pids,
            "old_ranks": old_ranks,
            "new_ranks": new_ranks,
            "gpu_index": index,
            "from_env": first,
            "to_env": second,
            "samples": len(samples),
        }
        (self.out / "h200_swap_samples.json").write_text(
            json.dumps({"swap": result, "samples": samples})
        )
        await sup.shutdown()
        result["after_shutdown_used_mib"] = self.used() // 2**20
        print("SWAP", json.dumps({k: v for k, v in result.items() if k != "operation"}))
        print("SWAP-OP", json.dumps(op.to_json()), flush=True)
        return result


def _label(pid: int, launcher: int, ranks: list[int]) -> str:
    if pid == launcher:
        return "launcher"
    return f"rank{ranks.index(pid)}" if pid in ranks else f"pid {pid}"


def _rank_pids(port: int) -> list[int]:
    """The stand-in's rank pids in rank order (rank 0 ignores SIGTERM and pins)."""
    import httpx

    r = httpx.get(f"http://127.0.0.1:{port}/get_server_info", timeout=5, trust_env=False)
    return [int(p) for p in r.json()["standin"]["pids"]]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.h200", description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-s", type=float, default=450.0, help="stop starting runs after this")
    p.add_argument("--reserve-s", type=float, default=40.0, help="kept for the swap")
    p.add_argument("--grace-s", type=float, default=2.0, help="SIGTERM -> SIGKILL grace")
    p.add_argument("--reps8", type=int, default=3, help="repetitions per method, 8 GiB pinned")
    p.add_argument("--reps48", type=int, default=2, help="repetitions per method, 48 GiB pinned")
    p.add_argument("--gib", type=float, default=GIB_PER_RANK, help=argparse.SUPPRESS)
    p.add_argument("--dry-run", action="store_true", help="no GPU: simulated ranks and probe")
    p.add_argument("--keep", action="store_true", help="keep the work folder (stand-in logs)")
    args = p.parse_args(argv)
    process.set_child_subreaper()  # as the daemon: orphaned ranks are re-parented to us
    bench = Bench(args)
    try:
        bench.meta()
        bench.teardown_cases()
        bench.swap()
    finally:
        for pid in process.find_members(None, tag_prefix=TAG_PREFIX):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        bench.results["elapsed_s"] = round(time.monotonic() - bench.t_start, 1)
        bench.save()
        if not args.keep:
            shutil.rmtree(bench.work, ignore_errors=True)
    print(f"done in {bench.results['elapsed_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
