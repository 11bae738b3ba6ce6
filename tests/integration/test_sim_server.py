"""The simulated SGLang server as a real process tree: it serves, holds simulated GPU memory
per rank, shuts down on SIGTERM, and misbehaves on purpose when asked to.

Every test tags its launches with a unique ``SGLANG_SUPERVISOR_INSTANCE`` and kills every
tagged process afterwards, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_supervisor import planner
from sglang_supervisor.sglang.schema import load_bundled
from sglang_supervisor.sim import capacity
from sglang_supervisor.sim.gpus import SimGpuProbe, sim_gpu_uuid
from sglang_supervisor.sim.server import build_parser
from tests.helpers import register_tag

REPO = Path(__file__).resolve().parents[2]
TAG_ENV = "SGLANG_SUPERVISOR_INSTANCE"
MIB = 2**20
TOTAL_MIB = 143771
TOTAL_BYTES = TOTAL_MIB * MIB
DECODE_LINE = re.compile(
    r"Decode batch, #running-req: \d+, #token: \d+, token usage: \d\.\d\d, "
    r"cuda graph: (True|False), gen throughput \(token/s\): \d+\.\d\d, #queue-req: \d+"
)


def wait_until(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``pred`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive(pid: int) -> bool:
    """Exists and is not a zombie (a zombie holds no memory and can't be killed further)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@dataclass
class Sim:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def status(self, path: str) -> int | None:
        """HTTP status of GET ``path``, None when nothing answers."""
        try:
            return httpx.get(self.url(path), timeout=5).status_code
        except httpx.TransportError:
            return None

    def get_json(self, path: str) -> Any:
        r = httpx.get(self.url(path), timeout=5)
        assert r.status_code == 200, (path, r.status_code, r.text)
        return r.json()

    def generate(self, text: str, max_new_tokens: int) -> httpx.Response:
        body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens}}
        return httpx.post(self.url("/generate"), json=body, timeout=30)

    def metrics(self) -> dict[str, float]:
        """Sample name -> value (every sample here carries the one model_name label)."""
        text = httpx.get(self.url("/metrics"), timeout=5).text
        return {
            s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
        }

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def exited(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"launcher pid {self.pid} still running after {timeout}s; log:\n"
                + self.log_text()[-3000:]
            ) from None

    def wait_ready(self, timeout: float = 20.0) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"launcher exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}"
                )
            return self.status("/health_generate") == 200

        wait_until(ready, timeout, "/health_generate 200")


class Sims:
    """Starts simulated servers for one test and kills every process they made."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.registry = tmp_path / "gpus"
        self.registry.mkdir()
        # The "sgs-test" prefix puts these under the suite-wide stray-process guard.
        self.tag = register_tag(f"sgs-test-sim-{uuid.uuid4().hex}")
        self.probe = SimGpuProbe(self.registry, count=8, memory_total_mib=TOTAL_MIB)
        self.sims: list[Sim] = []

    def env(self, gpus: int, faults: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("SGLANG_SIM_") and k not in ("CUDA_VISIBLE_DEVICES", TAG_ENV)
        }
        env.update(
            {
                TAG_ENV: self.tag,
                "SGLANG_SIM_GPU_DIR": str(self.registry),
                "SGLANG_SIM_GPU_MEMORY_MIB": str(TOTAL_MIB),
                "SGLANG_SIM_STARTUP_S": "0.2",
                "SGLANG_SIM_HEALTH_S": "0.01",
                "SGLANG_SIM_DRAIN_CHECK_S": "0.2",
                # No pinning time (the H200 figure would make a large host pool take minutes).
                "SGLANG_SIM_PIN_S_PER_GIB": "0",
                "SGLANG_SIM_UNPIN_S_PER_GIB": "0",
                "SGLANG_SIM_FAULTS": faults,
                "CUDA_VISIBLE_DEVICES": ",".join(sim_gpu_uuid(i) for i in range(gpus)),
            }
        )
        return env

    def start(
        self,
        *flags: str,
        tp: int = 2,
        gpus: int | None = None,
        faults: str = "",
        env: dict[str, str] | None = None,
        metrics: bool = True,
        port: int | None = None,
    ) -> Sim:
        """Launch ``--tp-size tp`` on ``gpus`` (default: tp) simulated GPUs, then ``flags``."""
        port = port or free_port()
        argv = ["--model-path", "sim/Llama-70B", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--tp-size", str(tp), *(["--enable-metrics"] if metrics else []), *flags]
        log = self.tmp / f"server-{len(self.sims)}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sglang_supervisor.sim.server", *argv],
                env={**self.env(tp if gpus is None else gpus, faults), **(env or {})},
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # as the supervisor spawns it
            )
        sim = Sim(proc, port, log)
        self.sims.append(sim)
        return sim

    def members(self) -> list[int]:
        """Live pids carrying this test's tag (launchers, ranks, orphans, detached ones)."""
        pids = []
        for p in psutil.process_iter():
            try:
                if p.environ().get(TAG_ENV) == self.tag and p.status() != psutil.STATUS_ZOMBIE:
                    pids.append(p.pid)
            except psutil.Error:
                continue
        return pids

    def used_mib(self) -> list[int]:
        return [s.memory_used_bytes // MIB for s in self.probe.sample(range(8))]

    def kill_all(self) -> None:
        for pid in self.members():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for sim in self.sims:
            sim.proc.kill()
            sim.proc.wait(timeout=10)
        wait_until(lambda: not self.members(), 10, "every tagged process to be gone")


@pytest.fixture
def sims(tmp_path: Path) -> Iterator[Sims]:
    s = Sims(tmp_path)
    try:
        yield s
    finally:
        s.kill_all()


def expected_rank_mib(fraction: float) -> int:
    return int(fraction * TOTAL_BYTES) // MIB


def default_rank_mib(tp: int) -> int:
    """What a rank holds without --mem-fraction-static: SGLang's own default fraction."""
    shape = capacity.SIM_MODEL.shape
    return expected_rank_mib(planner.sglang_default_fraction(TOTAL_BYTES, {"tp_size": tp}, shape))


# --- flags, in process -------------------------------------------------------------------


def test_parser_accepts_every_sglang_flag() -> None:
    raw = json.loads((REPO / "supervisor/data/sglang-0.5.23.json").read_text())
    parser = build_parser()
    for flag in raw["flags"]:
        for opt in flag["option_strings"]:
            if flag["boolean"] is not None:
                argv = [opt]
            else:
                value = str(flag["choices"][0]) if flag["choices"] else "1"
                argv = [opt, value]
            ns = parser.parse_args(argv)
            assert hasattr(ns, flag["dest"]), opt
    line = "--mem-fraction=0.9 --no-enable-tf32-matmul --tp 8 --cuda-graph-bs-decode 1 2 4"
    ns = parser.parse_args(line.split())
    assert ns.mem_fraction_static == 0.9  # a prefix, as SGLang's own parser allows
    assert ns.enable_tf32_matmul is False
    assert ns.tp_size == 8 and ns.cuda_graph_bs_decode == [1, 2, 4]
    assert len(vars(parser.parse_args([]))) == len(load_bundled().flags)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--tp-sise", "4"], "--tp-sise"),
        (["--kv-cache-dtype", "fp9"], "fp9"),
        (["--tp-size", "four"], "four"),
    ],
)
def test_bad_flag_exits_2_naming_it(sims: Sims, argv: list[str], named: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sglang_supervisor.sim.server", "--model-path", "m", *argv],
        env=sims.env(gpus=2, faults=""),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "error:" in done.stderr and named in done.stderr
    assert sims.members() == []


def test_too_few_gpus_fails_at_start(sims: Sims) -> None:
    sim = sims.start(tp=4, gpus=2)
    assert sim.exited(20) == 1
    assert "4 ranks" in sim.log_text() and "only 2 GPUs are visible" in sim.log_text()
    assert sims.used_mib() == [0] * 8


def test_port_in_use_fails_at_start(sims: Sims) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sim = sims.start("--port", str(port))
        assert sim.exited(20) == 1
    assert f"cannot bind the HTTP server to 127.0.0.1:{port}" in sim.log_text()
    assert sims.members() == []


def test_missing_registry_env_fails(sims: Sims) -> None:
    sim = sims.start(env={"SGLANG_SIM_GPU_DIR": ""})
    assert sim.exited(20) == 1
    assert "SGLANG_SIM_GPU_DIR is not set" in sim.log_text()


# --- the happy path ----------------------------------------------------------------------


def test_tp4_serves_holds_memory_and_drains_on_sigterm(sims: Sims) -> None:
    sim = sims.start(
        "--mem-fraction-static=0.85",
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--enable-hierarchical-cache",
        "--hicache-size",
        "30",
        "--served-model-name",
        "sim-70b",
        tp=4,
    )
    sim.wait_ready()

    info = sim.get_json("/get_server_info")
    m = capacity.SIM_MODEL
    assert info["tp_size"] == 4 and info["mem_fraction_static"] == 0.85
    assert info["version"] == "0.5.23" and info["simulated"] is True
    assert info["max_total_num_tokens"] == capacity.kv_tokens(
        TOTAL_BYTES,
        0.85,
        capacity.weight_bytes_per_rank(m, 4),
        capacity.cell_bytes(m, 4, "fp8_e4m3"),
    )
    assert info["max_total_num_tokens"] > 0
    assert sim.get_json("/v1/models")["data"][0]["id"] == "sim-70b"

    r = sim.generate("hello " * 40, 4)
    assert r.status_code == 200
    assert r.json()["meta_info"]["completion_tokens"] == 4

    metrics = sim.metrics()
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:gen_throughput",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "sglang:prompt_tokens_total",
    ):
        assert name in metrics, name
    assert metrics["sglang:generation_tokens_total"] >= 4

    # Each of the 4 ranks holds ≈ fraction × total on its own GPU; the others are empty.
    samples = sims.probe.sample(range(8))
    ranks = {c.pid for c in psutil.Process(sim.pid).children()}
    for s in samples[:4]:
        assert s.memory_used_bytes // MIB == expected_rank_mib(0.85)
        assert len(s.processes) == 1 and s.processes[0].pid in ranks
    assert [s.memory_used_bytes for s in samples[4:]] == [0] * 4

    # As SGLang 0.5.23: a request in flight at SIGTERM completes, a new one is still served,
    # /health answers 503 (tokenizer_manager.py sigterm_watchdog, http_server.py
    # health_generate's gracefully_exit check).
    answers: list[int] = []
    slow = threading.Thread(target=lambda: answers.append(sim.generate("slow", 300).status_code))
    slow.start()
    try:
        wait_until(lambda: sim.metrics()["sglang:num_running_reqs"] == 1, 10, "a running request")
        wait_until(lambda: DECODE_LINE.search(sim.log_text()), 10, "a Decode batch line")
        os.kill(sim.pid, signal.SIGTERM)
        wait_until(lambda: "draining" in sim.log_text(), 10, "the drain to begin")
        late = sim.generate("late", 1).status_code
        health = sim.status("/health")
    finally:
        slow.join(timeout=30)
    assert answers == [200]
    assert late == 200
    assert health == 503
    assert sim.exited(15) == 0
    assert "Gracefully exiting... Remaining number of requests 1." in sim.log_text()
    assert sims.members() == []
    assert sims.used_mib() == [0] * 8

    log = sim.log_text()
    assert f"Uvicorn running on http://127.0.0.1:{sim.port}" in log
    assert "The server is fired up and ready to roll!" in log
    assert "KV Cache is allocated. #tokens: " in log


def test_metrics_404_without_enable_metrics(sims: Sims) -> None:
    sim = sims.start(tp=2, metrics=False)
    sim.wait_ready()
    assert sim.status("/metrics") == 404
    assert sim.status("/health") == 200


# --- start-up failures -------------------------------------------------------------------


def test_capture_oom_exits_1_and_frees_memory(sims: Sims) -> None:
    # TP2 at 0.99: 1437.7 MiB outside the static pool, less than the 512 metadata + 256
    # parallel + 512 × 2 decode graphs + 58 × 8 prefill graphs = 2256 MiB spent before the
    # first prefill (memory_hook.py:309-313, :357-399).
    sim = sims.start("--mem-fraction-static", "0.99", env={"SGLANG_SIM_STARTUP_S": "1.0"})
    # Like SGLang's ranks, the simulated ones hold their memory while the start fails.
    wait_until(lambda: sims.used_mib()[:2] == [expected_rank_mib(0.99)] * 2, 10, "memory held")
    assert sim.exited(15) == 1
    log = sim.log_text()
    assert "Capture cuda graph failed: CUDA out of memory." in log
    assert "GPU 0 has a total capacity of 140.40 GiB of which 1.40 GiB is free" in log
    assert sims.members() == []
    assert sims.used_mib() == [0] * 8


def test_crash_on_start(sims: Sims) -> None:
    sim = sims.start(faults="crash_on_start")
    assert sim.exited(15) == 1
    assert "RuntimeError: simulated crash" in sim.log_text()
    assert "fired up" not in sim.log_text()
    assert sims.members() == []
    assert sims.used_mib() == [0] * 8


def test_weights_that_leave_no_kv_cache_fail_the_start(sims: Sims) -> None:
    # The 70B model's weights alone exceed one GPU's static fraction: SGLang refuses.
    sim = sims.start(tp=1)
    assert sim.exited(15) == 1
    assert "Not enough memory. Please try to increase --mem-fraction-static" in sim.log_text()
    assert sims.members() == []
    assert sims.used_mib() == [0] * 8


def test_values_sglang_cannot_parse_are_refused(sims: Sims) -> None:
    sim = sims.start("--context-length", "lots")
    assert sim.exited(15) == 2
    assert "argument --context-length" in sim.log_text()


def test_hang_on_start_never_ready_then_sigterm(sims: Sims) -> None:
    sim = sims.start(faults="hang_on_start")
    wait_until(lambda: "hang_on_start" in sim.log_text(), 15, "the hang")
    assert sim.status("/health_generate") == 503
    assert sim.status("/health") == 503
    assert sims.used_mib()[:2] == [default_rank_mib(tp=2)] * 2
    os.kill(sim.pid, signal.SIGINT)  # Ctrl-C stops it like SIGTERM
    assert sim.exited(15) == 0
    assert sims.used_mib() == [0] * 8


def test_unhealthy_after(sims: Sims) -> None:
    sim = sims.start(faults="unhealthy_after=1")
    sim.wait_ready()
    wait_until(lambda: sim.status("/health_generate") == 503, 10, "/health_generate 503")
    assert sim.status("/health") == 200
    assert sim.generate("still serving", 1).status_code == 200
    os.kill(sim.pid, signal.SIGTERM)
    assert sim.exited(15) == 0


# --- teardown the hard way ---------------------------------------------------------------


def test_ignore_sigterm_needs_sigkill(sims: Sims) -> None:
    sim = sims.start(faults="ignore_sigterm")
    sim.wait_ready()
    members = sims.members()
    assert len(members) == 4  # launcher, 2 ranks, detokenizer
    os.killpg(sim.pid, signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):
        sim.proc.wait(timeout=1.0)  # the bound on "SIGTERM does nothing"
    assert all(alive(pid) for pid in members)
    assert sim.status("/health_generate") == 200

    os.killpg(sim.pid, signal.SIGKILL)
    for pid in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert sim.exited(10) == -signal.SIGKILL
    wait_until(lambda: sims.used_mib() == [0] * 8, 10, "memory released")


def test_detach_ranks_escape_the_group_but_sigterm_still_stops_them(sims: Sims) -> None:
    sim = sims.start(faults="detach_ranks")
    sim.wait_ready()
    children = psutil.Process(sim.pid).children()
    assert len(children) == 3
    launcher_sid = os.getsid(sim.pid)
    for child in children:
        assert os.getsid(child.pid) != launcher_sid
        assert os.getpgid(child.pid) != sim.pid
    os.kill(sim.pid, signal.SIGTERM)  # the launcher still stops its own children
    assert sim.exited(15) == 0
    assert sims.members() == []
    assert sims.used_mib() == [0] * 8


def test_crash_after_orphans_ranks_holding_memory(sims: Sims) -> None:
    sim = sims.start(faults="crash_after=0.5")
    sim.wait_ready()
    ranks = [c.pid for c in psutil.Process(sim.pid).children()]
    assert sim.exited(10) == 1
    assert "crash_after" in sim.log_text()
    # The hard case: nobody killed the ranks; they still hold their GPUs.
    assert sorted(sims.members()) == sorted(ranks)
    assert sims.used_mib()[:2] == [default_rank_mib(tp=2)] * 2
    for pid in sims.members():  # found by the launch tag alone, as the supervisor does
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: sims.used_mib() == [0] * 8, 10, "orphans' memory released")


def test_launcher_sigkilled_alone_leaves_ranks_holding_memory(sims: Sims) -> None:
    sim = sims.start()
    sim.wait_ready()
    os.kill(sim.pid, signal.SIGKILL)
    assert sim.exited(10) == -signal.SIGKILL
    assert len(sims.members()) == 3
    assert sims.used_mib()[:2] == [default_rank_mib(tp=2)] * 2
    os.killpg(sim.pid, signal.SIGKILL)  # the group outlives its leader
    wait_until(lambda: sims.used_mib() == [0] * 8, 10, "memory released")


def test_dead_rank_takes_the_server_down(sims: Sims) -> None:
    sim = sims.start()
    sim.wait_ready()
    victim = psutil.Process(sim.pid).children()[0].pid
    os.kill(victim, signal.SIGKILL)
    assert sim.exited(10) == 1
    assert f"(pid {victim}) exited unexpectedly (signal SIGKILL)" in sim.log_text()
    assert sims.members() == []
    assert sims.used_mib() == [0] * 8
