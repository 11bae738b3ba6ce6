"""Stand-in for ``python -m sglang.launch_server``: torch ranks on real GPUs, SGLang's HTTP API.

The launcher (this module run with SGLang's flags) spawns one rank per GPU the layout
asks for — ``tp_size × pp_size`` ranks on CUDA devices ``base_gpu_id + r × gpu_id_step`` of
the ones ``CUDA_VISIBLE_DEVICES`` gives it, like SGLang's schedulers — and serves
``/health_generate`` and ``/health`` (200 once every rank holds its memory and while every
rank lives), ``/get_server_info`` and ``/server_info`` (the flags, each rank's pid, CUDA
device and GPU UUID as CUDA reports it), and ``/metrics`` (SGLang's gauge names).

Each rank allocates ``mem_fraction_static`` × the device's total memory with one plain
``torch.empty`` (cudaMalloc through torch's allocator), writes a JSON line about itself
into the launch's run directory and sleeps. A rank that exits takes the launcher down
(exit 1), like SGLang. On SIGTERM the launcher forwards SIGTERM to its ranks and exits 0
at once, so a rank that ignores SIGTERM is left orphaned: the harsh case for a supervisor.

Switches (environment; the supervisor passes a lever set's ``env`` through):

* ``SGLANG_STANDIN_SETSID=1``: every rank calls ``setsid()`` (leaves the launcher's
  process group and session);
* ``SGLANG_STANDIN_IGNORE_SIGTERM=1``: every rank ignores SIGTERM (only SIGKILL ends it);
* ``SGLANG_STANDIN_OOM=1``: every rank asks for more than its GPU has and dies of CUDA's
  out-of-memory error at start;
* ``SGLANG_STANDIN_STARTUP_S``: seconds a rank waits before allocating (a model load);
* ``SGLANG_STANDIN_FAKE_GPU_DIR``: no torch — a rank registers its bytes in this directory
  instead (``sglang_supervisor.sim.gpus`` registry format, read by the test's fake NVML), with
  ``SGLANG_STANDIN_FAKE_GPU_MIB`` per GPU: for rehearsing the test on a CPU-only host.

After its memory, a rank loads its share of ``--model-path``'s safetensors files onto its GPU
(``standin_weights``: a real load, from disk or the page cache; with fake GPUs a read), and
``/server_info`` reports each rank's ``weights_bytes``, ``weights_s`` and loader.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

GIB = 2**30
DEFAULT_FRACTION = 0.5


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="sglang.launch_server (stand-in)", allow_abbrev=False)
    p.add_argument("--model-path", "--model", dest="model_path", default="")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    p.add_argument("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--base-gpu-id", type=int, default=0)
    p.add_argument("--gpu-id-step", type=int, default=1)
    p.add_argument("--standin-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--standin-device", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--standin-run-dir", default="", help=argparse.SUPPRESS)
    args, _ = p.parse_known_args(argv)  # every other SGLang flag: accepted, not acted on
    return args


def log(who: str, message: str) -> None:
    try:
        sys.stdout.write(f"[{time.strftime('%H:%M:%S')} standin {who}] {message}\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


# ----------------------------------------------------------------------------- ranks


def _fake_allocate(device: int, nbytes: int) -> dict[str, Any]:
    registry = Path(os.environ["SGLANG_STANDIN_FAKE_GPU_DIR"])
    total = int(float(os.environ.get("SGLANG_STANDIN_FAKE_GPU_MIB", "143771")) * 2**20)
    if nbytes > total:
        raise MemoryError(
            f"CUDA out of memory (fake GPU). Tried to allocate {nbytes / GIB:.2f} GiB; "
            f"GPU {device} has a total capacity of {total / GIB:.2f} GiB"
        )
    uuids = [u for u in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if u]
    uuid = uuids[device]
    pid = os.getpid()
    with open(f"/proc/{pid}/stat", "rb") as f:
        ticks = float(f.read().rpartition(b")")[2].split()[19])
    with open("/proc/stat", "rb") as f:
        btime = next(float(ln.split()[1]) for ln in f if ln.startswith(b"btime"))
    entry = {
        "pid": pid,
        "create_time": ticks / os.sysconf("SC_CLK_TCK") + btime,
        "gpu_uuid": uuid,
        "bytes": nbytes,
    }
    tmp = registry / f".{pid}.json.tmp"
    tmp.write_text(json.dumps(entry))
    os.replace(tmp, registry / f"{pid}.json")
    return {"uuid": uuid, "total_bytes": total, "name": "fake GPU"}


def _torch_allocate(device: int, want: int | None, fraction: float) -> tuple[Any, dict[str, Any]]:
    import torch

    torch.cuda.set_device(device)
    free, total = torch.cuda.mem_get_info(device)
    nbytes = int(fraction * total) if want is None else want
    held = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
    held.fill_(1)
    torch.cuda.synchronize(device)
    props = torch.cuda.get_device_properties(device)
    info = {
        "uuid": str(props.uuid),
        "name": props.name,
        "total_bytes": int(total),
        "free_before_bytes": int(free),
        "bytes": nbytes,
    }
    return held, info


def run_rank(args: argparse.Namespace) -> int:
    rank, device = args.standin_rank, args.standin_device
    if _flag("SGLANG_STANDIN_SETSID"):
        os.setsid()
    if _flag("SGLANG_STANDIN_IGNORE_SIGTERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    who = f"TP{rank}"
    time.sleep(float(os.environ.get("SGLANG_STANDIN_STARTUP_S", "0") or 0))
    fraction = DEFAULT_FRACTION if args.mem_fraction_static is None else args.mem_fraction_static
    oom = _flag("SGLANG_STANDIN_OOM")
    t0 = time.monotonic()
    held: Any = None
    weights: Any = None
    try:
        if os.environ.get("SGLANG_STANDIN_FAKE_GPU_DIR"):
            total = int(float(os.environ.get("SGLANG_STANDIN_FAKE_GPU_MIB", "143771")) * 2**20)
            nbytes = total + GIB if oom else int(fraction * total)
            info = {**_fake_allocate(device, nbytes), "bytes": nbytes}
        else:
            held, info = _torch_allocate(device, (1 << 50) if oom else None, fraction)
        # The model's weights onto the GPU (its share of the files): a real load.
        from sglang.standin_weights import load

        fake = bool(os.environ.get("SGLANG_STANDIN_FAKE_GPU_DIR"))
        ranks = max(1, args.tp_size) * max(1, args.pp_size)
        weights, loaded = load(args.model_path, rank, ranks, None if fake else device)
        info.update(loaded)
        if loaded["weights_files"]:
            log(who, f"Load weight end: {loaded}")
    except Exception as exc:  # torch.OutOfMemoryError, or the fake one
        log(who, f"failed at start on CUDA device {device}: {type(exc).__name__}: {exc}")
        traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
        return 1
    info.update(
        rank=rank,
        pid=os.getpid(),
        cuda_device=device,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        alloc_s=round(time.monotonic() - t0, 4),
        setsid=_flag("SGLANG_STANDIN_SETSID"),
        ignore_sigterm=_flag("SGLANG_STANDIN_IGNORE_SIGTERM"),
        pgid=os.getpgid(0),
        sid=os.getsid(0),
    )
    tmp = Path(args.standin_run_dir) / f".rank{rank}.tmp"
    tmp.write_text(json.dumps(info))
    os.replace(tmp, Path(args.standin_run_dir) / f"rank{rank}.json")
    log(who, f"READY {json.dumps(info, sort_keys=True)}")
    while held is not None or weights or info:  # referenced until the process ends
        time.sleep(3600)
    return 0


# -------------------------------------------------------------------------- launcher


class Launcher:
    def __init__(self, args: argparse.Namespace, argv: list[str]) -> None:
        self.args, self.argv = args, argv
        self.ranks = max(1, args.tp_size) * max(1, args.pp_size)
        self.run_dir = Path(tempfile.mkdtemp(prefix="sglang-standin-"))
        self.children: list[subprocess.Popen[bytes]] = []
        self.started = time.monotonic()

    def spawn(self) -> None:
        for r in range(self.ranks):
            device = self.args.base_gpu_id + r * self.args.gpu_id_step
            extra = ["--standin-rank", str(r), "--standin-device", str(device)]
            extra += ["--standin-run-dir", str(self.run_dir)]
            argv = [sys.executable, "-m", "sglang.launch_server", *self.argv, *extra]
            self.children.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL))

    def rank_info(self) -> list[dict[str, Any]]:
        out = []
        for r in range(self.ranks):
            with contextlib.suppress(OSError, ValueError):  # not ready yet
                out.append(json.loads((self.run_dir / f"rank{r}.json").read_text()))
        return out

    def ready(self) -> bool:
        alive = all(c.poll() is None for c in self.children)
        return alive and len(self.rank_info()) == self.ranks

    def info(self) -> dict[str, Any]:
        ranks = self.rank_info()
        fraction = self.args.mem_fraction_static
        return {
            "version": "standin",
            "model_path": self.args.model_path,
            "tp_size": self.args.tp_size,
            "pp_size": self.args.pp_size,
            "mem_fraction_static": DEFAULT_FRACTION if fraction is None else fraction,
            # a made-up but honest-shaped figure: one token per KiB held
            "max_total_num_tokens": min((r.get("bytes", 0) for r in ranks), default=0) >> 10,
            "launcher_pid": os.getpid(),
            "standin": {"ranks": ranks},
        }


def make_handler(app: Launcher) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
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
                text = (
                    "sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\n"
                    "sglang:gen_throughput 0\nsglang:token_usage 0\n"
                    "sglang:cache_hit_rate 0\nsglang:generation_tokens_total 0\n"
                    "sglang:prompt_tokens_total 0\n"
                )
                self._send(200, text.encode())
            else:
                self._send(404, b"not found")

    return Handler


def run_launcher(args: argparse.Namespace, argv: list[str]) -> int:
    app = Launcher(args, argv)
    # No lock in a signal handler: Event.set() from a handler that interrupted the main
    # thread inside Event.wait() deadlocks on the event's own lock (seen on the H200: a
    # launcher that never exited on SIGTERM). Appending to a list takes no lock.
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    server = ThreadingHTTPServer((args.host, args.port), make_handler(app))
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    log("launcher", f"pid {os.getpid()} on {args.host}:{args.port}, {app.ranks} rank(s)")
    app.spawn()
    announced = False
    while not stopping:
        time.sleep(0.05)
        for r, child in enumerate(app.children):
            if child.poll() is not None:
                log("launcher", f"rank {r} (pid {child.pid}) exited with {child.returncode}")
                for c in app.children:
                    if c.poll() is None:
                        c.kill()
                return 1
        if not announced and app.ready():
            announced = True
            took = time.monotonic() - app.started
            log("launcher", f"all {app.ranks} rank(s) ready after {took:.2f}s")
    log("launcher", "SIGTERM: forwarding it to the ranks and exiting")
    for c in app.children:
        if c.poll() is None:
            c.send_signal(signal.SIGTERM)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.standin_rank is not None:
        return run_rank(args)
    return run_launcher(args, argv)


if __name__ == "__main__":
    sys.exit(main())
