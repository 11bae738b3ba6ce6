"""The daemon in real mode (NVML) end to end, driven over HTTP, on real GPUs.

``sglang-supervisor serve`` runs with ``server.python`` pointing at a throwaway virtual
environment where ``python -m sglang.launch_server`` is the SGLang-shaped stand-in
(``sglang_standin/``: one torch rank per GPU, each holding ``mem_fraction_static`` of it)
and every other ``sglang`` module is SGLang 0.5.23's own, so the schema and the
validation the daemon runs are SGLang's. The steps run in order on one daemon, as an
operator would see them: start; apply; apply onto ranks that ``setsid`` and ignore SIGTERM
and then away from them; an OOM at start rolls back; a foreign process on a managed GPU
refuses apply and restart; the launcher SIGKILLed from outside; the daemon SIGKILLed and
adopting its server; the daemon's SIGTERM leaving nothing; with two GPUs or more, a
foreign process on an unmanaged GPU is ignored.

    SGS_E2E_SGLANG_SITE=<dir with sglang 0.5.23> pytest -m gpu tests/gpu/test_daemon_e2e.py -s
    SGS_E2E_RESULTS=out.json ...        # the figures of every step as JSON
    SGS_E2E_FAKE_NVML=1 ...             # rehearsal on a CPU-only host (fake NVML, no torch)

Skips where there is no GPU (NVML or torch with CUDA missing) or no SGLang to validate with.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from sglang_supervisor.host.gpu import GpuInfo, GpuQueryError
from tests.gpu import e2e
from tests.gpu.e2e import alive
from tests.helpers import Daemon, tagged_processes, wait_until

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

TOL = 512 * 2**20  # the daemon's default release tolerance
FRACTIONS = (0.30, 0.40, 0.35)  # start, apply, rollback target: small enough for a foreign
TIMEOUTS = {
    "stop_grace_s": 3.0,
    "kill_timeout_s": 20.0,
    "release_timeout_s": 30.0,
    "ready_timeout_s": 240.0,
    "probation_s": 2.0,
    "liveness_interval_s": 2.0,
    "liveness_timeout_s": 10.0,
    "liveness_failures": 3,
    "backoff_initial_s": 0.5,
    "backoff_max_s": 2.0,
    "crash_loop_count": 5,
}


@dataclass
class Ctx:
    host: e2e.Host
    managed: list[GpuInfo]
    daemon: Daemon
    baseline: dict[int, int]
    figures: e2e.Figures
    work: Path
    model: Path
    server_python: Path
    foreign: list[subprocess.Popen[bytes]] = field(default_factory=list)

    # -- what a user sees ------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return self.daemon.status()

    def server_url(self) -> str:
        return f"http://127.0.0.1:{self.daemon.server_port}"

    def server_info(self) -> dict[str, Any]:
        r = httpx.get(self.server_url() + "/get_server_info", timeout=10, trust_env=False)
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data

    def rank_pids(self) -> list[int]:
        return sorted(int(r["pid"]) for r in self.server_info()["standin"]["ranks"])

    def ready(self, timeout: float = 300) -> dict[str, Any]:
        return self.daemon.wait_state("ready", timeout)

    def held_fraction(self) -> dict[int, float]:
        used = self.host.used()
        return {
            g.index: (used[g.index] - self.baseline[g.index]) / g.memory_total_bytes
            for g in self.managed
        }

    def assert_serving(self, fraction: float) -> dict[str, Any]:
        """Ready, one rank per managed GPU holding ``fraction`` of it, NVML agreeing."""
        st = self.ready()
        info = self.server_info()
        ranks = info["standin"]["ranks"]
        assert len(ranks) == len(self.managed), ranks
        assert st["levers"]["mem_fraction_static"] == fraction, st["levers"]
        held = self.held_fraction()
        for g in self.managed:
            assert fraction - 0.02 <= held[g.index] <= fraction + 0.03, (g.index, held)
        if self.host.pids_are_local():
            on_gpu = self.host.pids()
            for r in ranks:
                uuid = e2e.normal_uuid(r["uuid"]) if self.host.mode == "nvml" else r["uuid"]
                gpu = next(
                    g for g in self.managed if e2e.normal_uuid(g.uuid) == e2e.normal_uuid(uuid)
                )
                assert r["pid"] in on_gpu[gpu.index], (r, on_gpu)
        return st

    def apply(self, levers: dict[str, Any], env: dict[str, Any] | None = None) -> dict[str, Any]:
        r = self.daemon.apply(levers, env or {}, wait=True)
        assert r.status_code == 200, r.text
        op: dict[str, Any] = r.json()["operation"]
        return op


def _torch_cuda_ok() -> str | None:
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        ok = subprocess.run([sys.executable, "-c", code], timeout=180).returncode == 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"torch with CUDA cannot be asked: {exc}"
    return None if ok else "torch with CUDA is not available to run the stand-in's ranks"


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ctx]:
    work = tmp_path_factory.mktemp("e2e")
    try:
        host = e2e.Host(work)
    except GpuQueryError as exc:
        pytest.skip(f"no NVML: {exc}")
    if not host.gpus:
        pytest.skip("NVML sees no GPU")
    if host.mode == "nvml" and (why := _torch_cuda_ok()):
        pytest.skip(why)
    dirs, why = e2e.real_sglang_dirs()
    if why:
        pytest.skip(why)
    server_python = e2e.make_server_python(work / "server-venv", dirs)
    model = e2e.write_tiny_model(work / "tiny-llama")
    count = min(len(host.gpus), int(os.environ.get("SGS_E2E_GPUS", "2")))
    # By UUID, and with several GPUs in the reverse of NVML's order: the daemon must hand
    # CUDA exactly these GPUs, whatever order CUDA would number them in.
    managed = list(reversed(host.gpus[:count]))
    baseline = host.used()
    cuda_order = host.cuda_order()
    figures = e2e.Figures(
        {
            "mode": host.mode,
            "gpus_nvml_order": [
                {"index": g.index, "uuid": g.uuid, "name": g.name, "total": g.memory_total_bytes}
                for g in host.gpus
            ],
            "gpus_cuda_default_order": cuda_order,
            "managed_as_configured": [g.uuid for g in managed],
            "baseline_bytes": baseline,
            "pids_are_local": host.pids_are_local(),
            "python": sys.version.split()[0],
            "pid_ns": os.readlink("/proc/self/ns/pid"),
        }
    )
    daemon = Daemon(
        work,
        levers={
            "model_path": str(model),
            "tp_size": len(managed),
            "mem_fraction_static": FRACTIONS[0],
        },
        timeouts=TIMEOUTS,
        extra={
            "simulate": False,
            "server": {"python": str(server_python), "gpus": [g.uuid for g in managed]},
        },
    )
    daemon.env = dict(host.daemon_env)
    c = Ctx(host, managed, daemon, baseline, figures, work, model, server_python)
    t0 = time.monotonic()
    daemon.start(wait_ready=False)
    try:
        c.ready(300)
        figures.step("start", ready_s=round(time.monotonic() - t0, 3))
        yield c
    finally:
        for p in c.foreign:
            p.kill()
            p.wait(10)
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop(120)
        for leftover in tagged_processes(daemon.instance):  # a failed step must not
            leftover.kill()  # leave GPU memory held
        daemon.client.close()
        print("\nE2E daemon log tail:\n" + daemon.log()[-3000:])


# --------------------------------------------------------------------------------- steps


def test_01_started_with_sglang_schema(ctx: Ctx) -> None:
    """Real mode, SGLang's own schema (live), one rank per managed GPU, on the right GPU."""
    st = ctx.assert_serving(FRACTIONS[0])
    assert st["backend"] == "sglang"
    schema = ctx.daemon.client.get("/levers/schema", params={"q": "mem-fraction"}).json()
    assert schema["live"] is True, schema
    assert schema["sglang_version"] == "0.5.23", schema
    ranks = ctx.server_info()["standin"]["ranks"]
    # Rank r runs on CUDA device r of CUDA_VISIBLE_DEVICES = the managed UUIDs, in order.
    by_rank = sorted(ranks, key=lambda r: r["rank"])
    seen = [e2e.normal_uuid(r["uuid"]) for r in by_rank]
    if ctx.host.mode == "nvml":
        assert seen == [e2e.normal_uuid(g.uuid) for g in ctx.managed], seen
    # What Prometheus scrapes: the server up, and the GPU memory NVML reports.
    metrics = ctx.daemon.client.get("/metrics").text
    assert "sglang_supervisor_server_up 1.0" in metrics, metrics[:2000]
    used = ctx.host.used()
    for g in ctx.managed:
        line = next(
            ln
            for ln in metrics.splitlines()
            if ln.startswith(f'sglang_supervisor_gpu_memory_used_bytes{{gpu="{g.index}"}}')
        )
        assert abs(float(line.split()[-1]) - used[g.index]) < 2**30, (line, used)
    ctx.figures.step(
        "start",
        server_pid=st["server"]["pid"],
        rank_pids=ctx.rank_pids(),
        ranks_cuda_view=[
            {k: r.get(k) for k in ("rank", "cuda_device", "uuid", "cuda_visible_devices")}
            for r in by_rank
        ],
        held_fraction=ctx.held_fraction(),
        schema=f"{schema['sglang_version']} live={schema['live']}",
    )


def test_02_apply(ctx: Ctx) -> None:
    old_pid = ctx.status()["server"]["pid"]
    old_ranks = ctx.rank_pids()
    with e2e.Monitor(ctx.host) as mon:
        op = ctx.apply({"mem_fraction_static": FRACTIONS[1]})
    assert op["state"] == "succeeded", op
    st = ctx.assert_serving(FRACTIONS[1])
    assert st["server"]["pid"] != old_pid
    assert not alive([old_pid, *old_ranks])
    assert st["last_good_levers"]["levers"]["mem_fraction_static"] == FRACTIONS[1], st
    stop = next(p for p in op["phases"] if p["name"] == "stop")
    assert "SIGKILL" not in stop["detail"], stop  # a server that honours SIGTERM gets none
    ctx.figures.step(
        "apply",
        phases=e2e.phases(op),
        duration_s=op["duration_s"],
        release_per_gpu_s=mon.release_s(e2e.wall(stop["started_at"]), ctx.baseline, TOL),
        stop_detail=stop["detail"],
        release_detail=next(p["detail"] for p in op["phases"] if p["name"] == "release"),
        validate_detail=next(p["detail"] for p in op["phases"] if p["name"] == "validate"),
        rank_alloc_s=[r.get("alloc_s") for r in ctx.server_info()["standin"]["ranks"]],
        old_pid=old_pid,
        new_pid=st["server"]["pid"],
    )


def test_03_apply_onto_and_away_from_detached_sigterm_ignoring_ranks(ctx: Ctx) -> None:
    harsh = {"SGLANG_STANDIN_SETSID": "1", "SGLANG_STANDIN_IGNORE_SIGTERM": "1"}
    op = ctx.apply({}, harsh)
    assert op["state"] == "succeeded", op
    ctx.assert_serving(FRACTIONS[1])
    info = ctx.server_info()
    for r in info["standin"]["ranks"]:  # each rank is its own session, away from the group
        assert r["setsid"] and r["sid"] == r["pid"] and r["ignore_sigterm"], r
    detached = ctx.rank_pids()
    launcher = ctx.status()["server"]["pid"]

    with e2e.Monitor(ctx.host) as mon:
        op = ctx.apply({}, dict.fromkeys(harsh))  # None removes the env vars
    assert op["state"] == "succeeded", op
    st = ctx.assert_serving(FRACTIONS[1])
    assert st["env"] == {} or not set(harsh) & set(st["env"]), st["env"]
    assert not alive([launcher, *detached]), "ranks outlived it"
    on_gpu = set().union(*ctx.host.pids().values())
    assert not on_gpu & set(detached), (on_gpu, detached)
    stop = next(p for p in op["phases"] if p["name"] == "stop")
    assert "SIGKILL" in stop["detail"] or "sigkill" in stop["detail"].lower(), stop
    ctx.figures.step(
        "apply_away_from_detached_ignoring",
        phases=e2e.phases(op),
        duration_s=op["duration_s"],
        release_per_gpu_s=mon.release_s(e2e.wall(stop["started_at"]), ctx.baseline, TOL),
        stop_detail=stop["detail"],
    )


def test_04_oom_at_start_rolls_back(ctx: Ctx) -> None:
    before = ctx.status()
    op = ctx.apply({"mem_fraction_static": FRACTIONS[2]}, {"SGLANG_STANDIN_OOM": "1"})
    assert op["state"] == "rolled_back", op
    tail = "\n".join(op["log_tail"]).lower()
    assert "out of memory" in tail, op["log_tail"][-10:]
    st = ctx.assert_serving(FRACTIONS[1])  # last-good serves again
    assert "SGLANG_STANDIN_OOM" not in st["env"], st["env"]
    assert st["server"]["pid"] != before["server"]["pid"]
    stop = next(p for p in op["phases"] if p["name"] == "stop")
    assert "SIGKILL" not in stop["detail"], stop
    ctx.figures.step(
        "oom_rolled_back",
        stop_detail=stop["detail"],
        phases=e2e.phases(op),
        duration_s=op["duration_s"],
        rollback_reason=op["rollback_reason"],
    )


def test_05_foreign_process_on_managed_gpu_refuses_apply_and_restart(ctx: Ctx) -> None:
    gpu = ctx.managed[0]
    foreign = ctx.host.spawn_foreign(gpu, 2 * 2**30)
    ctx.foreign.append(foreign)
    try:
        wait_until(lambda: foreign.pid in ctx.host.pids()[gpu.index] or None, 30, 0.05, "NVML")
        before = ctx.status()
        ranks = ctx.rank_pids()
        r = ctx.daemon.apply({"mem_fraction_static": FRACTIONS[0]}, wait=True)
        assert r.status_code == 422, r.text
        assert str(foreign.pid) in r.text, r.text
        restart = ctx.daemon.client.post("/restart", params={"wait": "true"})
        observed: dict[str, Any] = {"status_code": restart.status_code}
        if restart.status_code == 200:
            observed["operation_state"] = restart.json()["operation"]["state"]
            observed["error"] = restart.json()["operation"].get("error")
        else:
            observed["body"] = restart.text[:400]
        ctx.figures.step("foreign_on_managed", apply_refused=r.text[:400], restart=observed)
        assert restart.status_code in (409, 422), observed
        assert str(foreign.pid) in restart.text, restart.text
        after = ctx.status()
        assert after["server"]["pid"] == before["server"]["pid"]
        assert ctx.rank_pids() == ranks
        assert after["state"] == "ready"
    finally:
        foreign.kill()
        foreign.wait(10)
        ctx.foreign.remove(foreign)
        wait_until(lambda: foreign.pid not in ctx.host.pids()[gpu.index], 30, 0.05, "freed")
        st = ctx.status()
        if st["state"] != "ready" and st["operation"] is None:  # the restart went ahead
            ctx.daemon.client.post("/start", params={"wait": "true"})


def test_06_launcher_sigkilled_from_outside(ctx: Ctx) -> None:
    st = ctx.ready()
    launcher, ranks = st["server"]["pid"], ctx.rank_pids()
    t0 = time.time()
    os.kill(launcher, signal.SIGKILL)

    def new_server() -> dict[str, Any] | None:
        s = ctx.daemon.status_or_none()
        if s and s["state"] == "failed":
            raise AssertionError(f"the daemon gave up: {s['state_reason']}")
        ok = s and s["state"] == "ready" and s["server"] and s["server"]["pid"] != launcher
        return s if ok else None

    with e2e.Monitor(ctx.host) as mon:
        st = wait_until(new_server, 300, 0.05, "a restarted server")
    recovered = time.time() - t0
    assert not alive(ranks), "the orphaned ranks were left"
    ctx.assert_serving(FRACTIONS[1])
    ctx.figures.step(
        "launcher_sigkill",
        recovery_s=round(recovered, 3),
        release_per_gpu_s=mon.release_s(t0, ctx.baseline, TOL),
        restarts=st.get("restarts"),
        old_pid=launcher,
        new_pid=st["server"]["pid"],
    )


def test_07_daemon_sigkill_then_adopted(ctx: Ctx) -> None:
    st = ctx.ready()
    launcher, ranks = st["server"]["pid"], ctx.rank_pids()
    proc = ctx.daemon.proc
    assert proc is not None
    proc.kill()
    proc.wait(30)
    assert alive([launcher, *ranks]) == [launcher, *ranks]
    t0 = time.monotonic()
    ctx.daemon.start(wait_ready=False)
    st = ctx.ready(120)
    adopted_s = time.monotonic() - t0
    assert st["server"]["pid"] == launcher, st["server"]
    assert ctx.rank_pids() == ranks
    ctx.assert_serving(FRACTIONS[1])
    ctx.figures.step("daemon_sigkill_adopt", adopt_to_ready_s=round(adopted_s, 3), pid=launcher)


def test_08_daemon_sigterm_leaves_nothing(ctx: Ctx) -> None:
    ctx.ready()
    launcher, ranks = ctx.status()["server"]["pid"], ctx.rank_pids()
    assert ctx.daemon.proc is not None
    # Everything the daemon runs (the server, any helper in the server's interpreter).
    kids = [p.pid for p in psutil.Process(ctx.daemon.proc.pid).children(recursive=True)]
    t0 = time.monotonic()
    assert ctx.daemon.stop(180) == 0, ctx.daemon.log()
    took = time.monotonic() - t0
    assert tagged_processes(ctx.daemon.instance) == []
    assert not alive([launcher, *ranks])
    # Whatever else the daemon ran (SGLang's resolution helper in server.python) must go
    # too; a helper may notice its parent's exit a moment later: record how long it took.
    lingering = [" ".join(psutil.Process(p).cmdline())[:120] for p in alive(kids)]
    t1 = time.monotonic()
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not alive(kids), 60, 0.05, "the daemon's other children to exit")
    children_gone_s = time.monotonic() - t1
    left = [" ".join(psutil.Process(p).cmdline())[:160] for p in alive(kids)]
    ctx.figures.step(
        "daemon_sigterm",
        children_lingering_at_exit=lingering,
        children_gone_after_exit_s=round(children_gone_s, 3),
    )
    assert not left, f"still running 60 s after the daemon exited: {left}"
    used = ctx.host.used()
    for g in ctx.managed:
        assert used[g.index] <= ctx.baseline[g.index] + TOL, (g.index, used, ctx.baseline)
    ctx.figures.step("daemon_sigterm", exit_s=round(took, 3), used_after=used)


def test_09_foreign_process_on_unmanaged_gpu_is_ignored(ctx: Ctx, tmp_path: Path) -> None:
    if len(ctx.host.gpus) < 2:
        pytest.skip(
            f"needs 2 GPUs (a managed one and an unmanaged one); NVML sees {len(ctx.host.gpus)}"
        )
    unmanaged, mine = ctx.host.gpus[0], ctx.host.gpus[1]
    foreign = ctx.host.spawn_foreign(unmanaged, 2 * 2**30)
    ctx.foreign.append(foreign)
    d = Daemon(
        tmp_path,
        levers={"model_path": str(ctx.model), "tp_size": 1, "mem_fraction_static": FRACTIONS[0]},
        timeouts=TIMEOUTS,
        extra={
            "simulate": False,
            "server": {"python": str(ctx.server_python), "gpus": [mine.uuid]},
        },
    )
    d.env = dict(ctx.host.daemon_env)
    try:
        d.start(wait_ready=False)
        d.wait_state("ready", 300)
        r = d.apply({"mem_fraction_static": FRACTIONS[1]}, wait=True)
        assert r.status_code == 200 and r.json()["operation"]["state"] == "succeeded", r.text
        assert foreign.poll() is None, "a process on an unmanaged GPU was touched"
        assert d.stop(180) == 0
        used = ctx.host.used()
        assert used[mine.index] <= ctx.baseline[mine.index] + TOL, used
        assert foreign.pid in ctx.host.pids()[unmanaged.index]
        ctx.figures.step("foreign_on_unmanaged", phases=e2e.phases(r.json()["operation"]))
    finally:
        if d.proc is not None and d.proc.poll() is None:
            d.stop(120)
        d.client.close()
