"""The simulated server's launcher process: start-up, serving, SIGTERM, failure.

Start-up: check the GPUs, spawn the ranks and the detokenizer, "load" the model
(``SGLANG_SIM_STARTUP_S``), size the KV pool with the planner's math, pin the hierarchical
cache's host pool (``SGLANG_SIM_PIN_S_PER_GIB`` × the node's pinned GiB: 0.58 s/GiB, the
H200 figure, by default), become ready. At the stop each rank's GPU memory stays held
while the node's host pool is unpinned (``SGLANG_SIM_UNPIN_S_PER_GIB``, 0.2 s/GiB; the
ranks do it, ``sim.rank``), as SGLang's schedulers release it in userspace at a graceful
exit and the kernel at any other (``mem_cache/pool_host/base.py:283-300``).

SIGTERM or SIGINT, as SGLang 0.5.23 handles it (tokenizer_manager.py ``SignalHandler`` and
``sigterm_watchdog``): the server marks itself as exiting — /health and /health_generate
answer 503 from then on — but it keeps accepting and serving generations. A watchdog looks
at the remaining requests every ``SGLANG_SIM_DRAIN_CHECK_S`` (5 s as in SGLang, counted from
the start, so even an idle server takes up to that long to notice), logs
``Gracefully exiting... Remaining number of requests N`` and, once none are left, stops the
children and exits 0. There is no deadline of its own: whoever sent SIGTERM decides when to
SIGKILL, which cuts the streams in flight. A second signal changes nothing (SGLang's handler
only sets the same flag). The synthetic load's clients disconnect at the signal.

Exit 1 on a start-up failure (CUDA-graph capture out of memory, too few GPUs, a fault, a
child that died), and when a prefill runs out of activation memory after ready
(``sglang_supervisor.sim.capacity``: where the fraction leaves less than the prefill needs).
"""

from __future__ import annotations

import enum
import math
import os
import queue
import signal
import threading
import time
from types import FrameType
from typing import Any

from sglang_supervisor.planner import ModelSpec
from sglang_supervisor.planner.nodes import NodeShare
from sglang_supervisor.sim import capacity, info, metrics
from sglang_supervisor.sim.children import Children, ServerFailure, signal_name
from sglang_supervisor.sim.flags import ServerConfig, SimEnv, log
from sglang_supervisor.sim.http import HttpServer
from sglang_supervisor.sim.kernel_cache import compile_kernels
from sglang_supervisor.sim.load import LOAD_ENV
from sglang_supervisor.sim.runtime import Runtime
from sglang_supervisor.sim.start_checks import check_gpus, check_start_faults

#: Seconds between time-driven checks of the main loop (children alive, faults, logging).
TICK_S = 0.1
#: SIGTERM -> SIGKILL grace for the ranks and the detokenizer at shutdown.
CHILD_GRACE_S = 5.0
#: Interval of the "Decode batch" log line while requests run.
DECODE_LOG_S = 1.0


class Phase(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    #: SIGTERM received: still serving, /health answers 503, waiting for requests to end.
    DRAINING = "draining"
    STOPPING = "stopping"


class Launcher:
    """The launcher process: HTTP, ranks, the simulated load, shutdown."""

    def __init__(self, cfg: ServerConfig, env: SimEnv, model: ModelSpec | None = None) -> None:
        self.cfg = cfg
        self.env = env
        self.faults = env.faults
        self.model = model or capacity.SIM_MODEL
        self.phase = Phase.LOADING
        self.healthy = True
        self._signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._children = Children(env.registry, env.faults)
        self._http: HttpServer | None = None
        self._started_at = time.monotonic()
        self.context_length = cfg.context_length
        self.tokens_per_s = env.tokens_per_s
        self._ready_at: float | None = None
        #: A /health_generate has answered 200: the synthetic load begins (``_tick``).
        self._seen_healthy = False
        self._last_decode_log = 0.0

        # The planner's math, on the parsed flags, resolved as SGLang resolves them
        # (supervisor/sim/capacity.py): plan and simulation agree exactly.
        total = env.memory_bytes
        self.resolved = capacity.resolve(self.model, cfg.args, total)
        self.mem_fraction = self.resolved.mem_fraction_static
        self.cell_bytes = self.resolved.cell_bytes
        self.weight_bytes = self.resolved.weight_bytes_per_rank
        self.rank_bytes = int(self.mem_fraction * total)
        tokens = self.resolved.max_total_num_tokens
        self.max_total_num_tokens = tokens
        self.host_pool_tokens = self.resolved.host_pool_tokens
        #: This node's pinned host pool: every rank's (what pinning and unpinning cost).
        per_node = NodeShare.of(cfg.args).ranks_per_node
        self.pinned_bytes = int(self.host_pool_tokens * self.cell_bytes * per_node)
        self.engine = capacity.engine_for(self.resolved, env, total, cfg.cuda_graph)
        self.max_running_requests = max(1, self.resolved.max_running_requests)
        #: What SGLang changes on a running server (its runtime endpoints).
        self.runtime = Runtime(
            cfg,
            workers=len(self.engine.workers),
            max_running=self.engine.max_running,
            inflight=self.engine.inflight,
            update_faults=int(env.faults.update_weights_fail or 0),
        )
        self._registry = metrics.registry_for(self.engine, cfg.served_model_name, cfg.num_ranks)

    # -- what the HTTP handlers read (http.App) --

    @property
    def served_model_name(self) -> str:
        return self.runtime.served_model_name

    def health(self, generate: bool) -> tuple[int, str]:
        """/health_generate (``generate``) runs a one-token generation SGLang polls once a
        second: it takes ``SGLANG_SIM_HEALTH_S``. /health answers at once, as SGLang's
        does with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0. Both answer 503 while
        loading and from SIGTERM on (http_server.py: "Health check request received
        during shutdown")."""
        if generate and self.phase is Phase.READY and self.healthy:
            with self.runtime.model_lock.reading():  # a generation: waits for an update
                time.sleep(self.env.health_s)
        if self.phase is Phase.READY and (self.healthy or not generate):
            if generate:
                self._seen_healthy = True  # the synthetic load's clients may come now
            return 200, ""
        if self.phase is Phase.DRAINING:
            log("Health check request received during shutdown. Returning 503.")
        why = "unhealthy" if self.phase is Phase.READY else self.phase.value
        return 503, why

    def accepting(self) -> str | None:
        if self.phase in (Phase.READY, Phase.DRAINING):
            return None
        return str(self.phase.value)

    def model_info(self) -> dict[str, Any]:
        return info.model_info(self.cfg, self.runtime)

    def server_info(self) -> dict[str, Any]:
        return info.server_info(self.cfg, self.resolved, self.engine, self.runtime)

    def models(self) -> dict[str, Any]:
        return info.models(self.cfg, self.runtime)

    def metrics_text(self) -> bytes | None:
        return metrics.render(self._registry) if self.cfg.enable_metrics else None

    # -- lifecycle --

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (exit 0) or a failure (exit 1)."""
        self._install_signals()
        try:
            self._http = HttpServer(
                (self.cfg.host, self.cfg.port),
                self,
                tuple(self.cfg.args.get("uvicorn_access_log_exclude_prefixes") or ()),
            )
        except OSError as exc:
            log(
                f"ERROR: cannot bind the HTTP server to {self.cfg.host}:{self.cfg.port}: "
                f"{exc.strerror or exc}"
            )
            return 1
        threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        # SGLang 0.5.23's line (srt/entrypoints/engine.py:311): a dict of every flag, the
        # secret ones as given (it hides only the watermark's keys).
        log(f"server_args={dict(self.cfg.args)!r}")
        try:
            self._serve()
            return self._shutdown()  # a prefill can still run out of memory while draining
        except ServerFailure as exc:
            return self._fail(exc.lines, exc.who)
        except Exception as exc:  # a bug or an OS error: never leave the ranks behind
            return self._fail([f"{type(exc).__name__}: {exc}"], "")

    def _check_gpus(self) -> None:
        """Before any rank: the visible GPUs (a group's leader also meets its nodes)."""
        check_gpus(self)

    def _serve(self) -> None:
        """Spawn, load, become ready and serve; return when a stop signal arrives."""
        self._check_gpus()
        cfg = self.cfg
        # check_gpus has bounded the ranks by the visible GPUs: one child per rank is safe.
        gpus = [self.env.visible_gpus[cfg.layout.gpu_id(r)] for r in range(cfg.num_ranks)]
        self._children.spawn(gpus, self.rank_bytes, self.env.pins.unpin_s(self.pinned_bytes))
        if self._children.wait_registered(self._wait):
            return
        log(f"Load weight begin. avail mem={self.env.memory_bytes / 2**30:.2f} GB", "TP0")
        if self._wait(time.monotonic() + self.env.startup_s):
            return
        check_start_faults(self)
        log(compile_kernels(self.cfg, os.environ), "TP0")
        avail = (self.env.memory_bytes - self.weight_bytes) / 2**30
        log(
            f"Load weight end. type={self.model.architecture}, dtype=torch.bfloat16, "
            f"avail mem={avail:.2f} GB, mem usage={self.weight_bytes / 2**30:.2f} GB.",
            "TP0",
        )
        if self.faults.hang_on_start:
            log("(simulated fault hang_on_start: the server never becomes ready)", "TP0")
            self._wait(None)
            return
        half = self.max_total_num_tokens * self.cell_bytes / 2 / 2**30
        log(
            f"KV Cache is allocated. #tokens: {self.max_total_num_tokens}, "
            f"K size: {half:.2f} GB, V size: {half:.2f} GB",
            "TP0",
        )
        if self.cfg.enable_hierarchical_cache:
            log(
                f"Allocating kv hierarchical KV host pool: {self.host_pool_tokens} tokens, "
                f"{self.host_pool_tokens * self.cell_bytes / 1e9:.2f} GB host memory.",
                "TP0",
            )
            if self.resolved.hicache_log:
                log(self.resolved.hicache_log, "TP0")
            pin_s = self.env.pins.pin_s(self.pinned_bytes)
            log(
                f"(simulated: pinning {self.pinned_bytes / 2**30:,.1f} GiB of host memory over "
                f"this node's ranks takes {pin_s:.1f} s at "
                f"{self.env.pins.pin_s_per_gib:g} s per GiB)",
                "TP0",
            )
            if self._wait(time.monotonic() + pin_s):
                return
        log(
            f"max_total_num_tokens={self.max_total_num_tokens}, "
            f"max_running_requests={self.engine.max_running}, "
            f"context_len={self.cfg.context_length}",
            "TP0",
        )
        port = self._http.server_port if self._http is not None else self.cfg.port
        log(f"INFO:     Uvicorn running on http://{self.cfg.host}:{port} (Press CTRL+C to quit)")
        log("The server is fired up and ready to roll!")
        if self.env.load is not None:
            log(f"Synthetic load ({LOAD_ENV}): {self.env.load.describe()}")
        self._set_phase(Phase.READY, "warm-up generation done")
        self._ready_at = time.monotonic()
        self._wait(None)

    def _install_signals(self) -> None:
        if self.faults.ignore_sigterm:
            # Only SIGKILL ends this process (the children ignore SIGTERM on their own).
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            return

        def enqueue(signum: int, frame: FrameType | None) -> None:
            self._signals.put(signum)  # SimpleQueue.put is safe in a signal handler

        signal.signal(signal.SIGTERM, enqueue)
        signal.signal(signal.SIGINT, enqueue)

    def _wait(self, until: float | None) -> bool:
        """Do time-driven work until ``until`` (monotonic; None: forever).

        Returns True as soon as SIGTERM or SIGINT arrives; raises ``ServerFailure`` when a
        child dies.
        """
        while True:
            now = time.monotonic()
            if until is not None and now >= until:
                return False
            timeout = TICK_S if until is None else min(TICK_S, until - now)
            try:
                signum = self._signals.get(timeout=timeout)
            except queue.Empty:
                self._tick()
                continue
            log(f"Received {signal_name(signum)}; shutting down")
            return True

    def _tick(self) -> None:
        self._children.check_alive()
        if self.phase not in (Phase.READY, Phase.DRAINING) or self._ready_at is None:
            return
        now = time.monotonic()
        since_ready = now - self._ready_at
        if self.faults.crash_due(since_ready):
            pids = [c.popen.pid for c in self._children.all]
            log(
                f"(simulated fault crash_after={self.faults.crash_after:g}: launcher pid "
                f"{os.getpid()} dies abruptly; children {pids} are left running)"
            )
            os._exit(1)
        if self.healthy and self.faults.unhealthy_due(since_ready):
            self.healthy = False
            log(
                f"(simulated fault unhealthy_after={self.faults.unhealthy_after:g}: "
                "/health_generate now answers 503)"
            )
        if self._seen_healthy:
            # The synthetic load's clients, as a router's, send work only to a server
            # seen healthy: whatever the load breaks (a prefill out of memory) happens
            # after whoever launched it saw it answer /health_generate, never before.
            self.engine.tick(now)
        if self.engine.prefill_oom is not None:
            report = capacity.prefill_oom_report(
                self.resolved, self.env.memory_bytes, self.engine.prefill_oom
            )
            raise ServerFailure(report, "TP0")
        self._log_decode()

    def _log_decode(self) -> None:
        """SGLang's periodic "Decode batch" line, while requests run or wait."""
        now = time.monotonic()
        if now - self._last_decode_log < DECODE_LOG_S:
            return
        lines = metrics.decode_lines(self.engine, self.cfg.num_ranks)
        if lines:
            self._last_decode_log = now
        for who, line in lines:
            log(line, who)

    def _set_phase(self, new: Phase, reason: str) -> None:
        log(f"simulated server: {self.phase.value} -> {new.value} ({reason})")
        self.phase = new

    def _shutdown(self) -> int:
        """SGLang's graceful exit: serve on until nothing is left, looking every
        ``drain_check_s``; then stop the children (SIGTERM, SIGKILL after
        ``CHILD_GRACE_S``) and the HTTP server; exit status 0."""
        if self.phase is Phase.READY:
            # ready -> draining
            self._set_phase(Phase.DRAINING, "SIGTERM: draining requests and shutting down")
            aborted = self.engine.stop_synthetic()
            if aborted:
                log(f"Aborted {aborted} synthetic requests (the load's clients disconnect)")
            self._drain()
        self.engine.close()
        # draining/loading -> stopping
        self._set_phase(Phase.STOPPING, "no request left")
        self._children.stop(CHILD_GRACE_S)
        self._stop_http()
        log("Shutdown complete.")
        return 0

    def _drain(self) -> None:
        """Until no real request runs or waits, looked at on the watchdog's beat."""
        step = self.env.drain_check_s
        now = time.monotonic()
        beats = math.floor((now - self._started_at) / step) + 1
        next_check = self._started_at + beats * step
        while True:
            self._serve_until(next_check)
            left = self.engine.inflight()
            log(f"Gracefully exiting... Remaining number of requests {left}.")
            if left == 0:
                return
            next_check += step

    def _serve_until(self, until: float) -> None:
        """Time-driven work until ``until``; further stop signals change nothing."""
        while True:
            now = time.monotonic()
            if now >= until:
                return
            try:
                signum = self._signals.get(timeout=min(TICK_S, until - now))
            except queue.Empty:
                self._tick()
                continue
            log(f"Received {signal_name(signum)} again; still draining")

    def _fail(self, lines: list[str], who: str) -> int:
        for line in lines:
            log(line, who)
        log("A server process failed; killing the simulated server's processes (exit 1)")
        self._stop_http()
        self._children.stop(0.0)
        return 1

    def _stop_http(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
