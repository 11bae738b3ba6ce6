"""A stand-in SGLang server on a real GPU: an HTTP launcher plus torch rank children.

``python tests/benchmarks/h200_standin.py --host H --port P [SGLang flags, ignored]``

The launcher spawns ``SGLANG_STANDIN_RANKS`` rank children (``tests/gpu/standin.py`` in
rank mode: each holds ``SGLANG_STANDIN_GIB`` GiB on the first visible CUDA device with a
plain ``torch.empty``, rank ``SGLANG_STANDIN_PIN_RANK`` also pins
``SGLANG_STANDIN_PIN_GIB`` GiB of host memory, ranks listed in
``SGLANG_STANDIN_IGNORE_SIGTERM`` ignore SIGTERM) and serves the endpoints the supervisor
uses: ``/health_generate`` answers 200 once every rank has printed its ``READY`` line and
while every rank is alive, ``/get_server_info``, ``/metrics``, ``/health``.

On SIGTERM the launcher forwards SIGTERM to its ranks and exits at once; a rank that
ignores SIGTERM is left running, orphaned, until someone SIGKILLs it. A rank that dies
takes the launcher down (exit 1), like SGLang.

Without a GPU (``SGLANG_STANDIN_SIM_REGISTRY=<dir>``) the ranks are simulated ones
(``sglang_supervisor.sim.rank``, registering their bytes for ``SimGpuProbe``): a dry run of the
benchmark's flow.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

RANK_SCRIPT = Path(__file__).resolve().parents[1] / "gpu" / "standin.py"
READY_MARKERS = ("READY rank=", "holding ")


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, "") or default)


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, "") or default)


class Launcher:
    def __init__(self) -> None:
        self.ranks = _env_int("SGLANG_STANDIN_RANKS", 4)
        self.gib = _env_float("SGLANG_STANDIN_GIB", 1.0)
        self.pin_gib = _env_float("SGLANG_STANDIN_PIN_GIB", 0.0)
        self.pin_rank = _env_int("SGLANG_STANDIN_PIN_RANK", 0)
        text = os.environ.get("SGLANG_STANDIN_IGNORE_SIGTERM", "")
        self.ignore = [int(x) for x in text.split(",") if x.strip()]
        self.sim_registry = os.environ.get("SGLANG_STANDIN_SIM_REGISTRY", "")
        self.children: list[subprocess.Popen[bytes]] = []
        self.ready_count = 0
        self.lock = threading.Lock()
        self.started = time.monotonic()

    def rank_argv(self, rank: int) -> list[str]:
        if self.sim_registry:
            gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0]
            argv = [
                sys.executable,
                "-m",
                "sglang_supervisor.sim.rank",
                "--registry",
                self.sim_registry,
            ]
            argv += ["--rank", str(rank), "--gpu-uuid", gpu, "--bytes", str(int(self.gib * 2**30))]
            return argv + (["--ignore-sigterm"] if rank in self.ignore else [])
        argv = [sys.executable, str(RANK_SCRIPT), "--rank", str(rank), "--gib", str(self.gib)]
        argv += ["--pin-gib", str(self.pin_gib), "--pin-rank", str(self.pin_rank)]
        return [*argv, "--ignore-sigterm", *map(str, self.ignore)]

    def spawn(self) -> None:
        for r in range(self.ranks):
            child = subprocess.Popen(
                self.rank_argv(r),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            self.children.append(child)
            threading.Thread(target=self._forward, args=(child,), daemon=True).start()

    def _forward(self, child: subprocess.Popen[bytes]) -> None:
        assert child.stdout is not None
        for raw in child.stdout:
            line = raw.decode(errors="replace").rstrip()
            log(line)
            if any(m in line for m in READY_MARKERS):
                with self.lock:
                    self.ready_count += 1
                    if self.ready_count == self.ranks:
                        log(f"all {self.ranks} ranks ready after {self.elapsed():.2f}s")

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def ready(self) -> bool:
        with self.lock:
            n = self.ready_count
        return n >= self.ranks and all(c.poll() is None for c in self.children)

    def info(self) -> dict[str, Any]:
        return {
            "max_total_num_tokens": 0,
            "standin": {
                "ranks": self.ranks,
                "gib_per_rank": self.gib,
                "pinned_gib": self.pin_gib,
                "pin_rank": self.pin_rank,
                "ignore_sigterm": self.ignore,
                "pids": [c.pid for c in self.children],
            },
        }


def log(message: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    try:
        sys.stdout.write(f"[{stamp} standin] {message}\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


def make_handler(app: Launcher) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two sends: with Nagle on, the client's delayed ACK
        # would hold the body back ~40 ms on a kept-alive connection.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/health", "/health_generate"):
                ok = app.ready()
                self._send(200 if ok else 503, b"OK" if ok else b"loading")
            elif path in ("/get_server_info", "/server_info"):
                self._send(200, json.dumps(app.info()).encode(), "application/json")
            elif path == "/metrics":
                self._send(200, b"sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\n")
            else:
                self._send(404, b"not found")

    return Handler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    args, _ = p.parse_known_args(argv)
    app = Launcher()
    # No lock in a signal handler: Event.set() there can deadlock against the main thread's
    # own Event.wait() (seen with tests/gpu's stand-in on an H200); a list append takes none.
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    server = ThreadingHTTPServer((args.host, args.port), make_handler(app))
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    log(f"launcher pid {os.getpid()} on {args.host}:{args.port}: {json.dumps(app.info())}")
    app.spawn()
    while not stopping:
        time.sleep(0.05)
        for r, child in enumerate(app.children):
            if child.poll() is not None:
                log(f"rank {r} (pid {child.pid}) exited with {child.returncode}; exiting")
                for c in app.children:
                    if c.poll() is None:
                        c.kill()
                return 1
    log("SIGTERM: forwarding it to the ranks and exiting")
    for c in app.children:
        if c.poll() is None:
            c.send_signal(signal.SIGTERM)
    return 0


if __name__ == "__main__":
    sys.exit(main())
