"""The simulated SGLang server: ``python -m supervisor.sim.server <SGLang launch flags>``.

A real process tree shaped like SGLang 0.5.23's: this launcher serves SGLang's HTTP
endpoints and logs SGLang-shaped lines; it spawns one ``supervisor.sim.rank`` child per
rank (tp × dp × pp), each "holding" GPU memory through the simulated-GPU registry, plus a
detokenizer child. The flags are parsed by a parser built from the bundled 0.5.23 schema,
so exactly SGLang's flags are accepted (an unknown one exits 2, as SGLang does).

Environment:

* ``CUDA_VISIBLE_DEVICES`` — comma list of simulated GPU UUIDs (or indices); rank r uses
  entry ``base_gpu_id + r × gpu_id_step``. Unset: the 8 default simulated GPUs.
* ``SGLANG_SIM_GPU_DIR`` (required) — the registry directory of ``SimGpuProbe``.
* ``SGLANG_SIM_GPU_MEMORY_MIB`` (143771), ``SGLANG_SIM_OOM_FRACTION`` (0.95: a larger
  ``--mem-fraction-static`` fails like a CUDA OOM), ``SGLANG_SIM_STARTUP_S`` (1.5: the
  simulated model load), ``SGLANG_SIM_FAULTS`` (see ``supervisor.sim.faults``).
* ``SGLANG_SIM_LOAD`` — a synthetic workload bounded by the KV pool (see
  ``supervisor.sim.load``).
* ``SGLANG_SIM_MODEL_CONFIG`` — a config.json for the served model when ``--model-path``
  is not a local model directory (see ``supervisor.sim.capacity``).

The KV pool (``max_total_num_tokens``) is sized by ``supervisor.planner`` — the same math
as ``POST /plan`` — including SGLang's own default ``mem_fraction_static`` when the flag
is unset.

Signals: SIGTERM or SIGINT stop taking requests, wait for in-flight ones (bounded), send
SIGTERM to the children, SIGKILL whatever is left after ``CHILD_GRACE_S``, reap, exit 0.
Exit 1 on a start-up failure (OOM, too few GPUs, a fault, a child that died).
"""

from __future__ import annotations

import argparse
import enum
import io
import json
import math
import os
import queue
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from supervisor import planner
from supervisor.layout import Layout
from supervisor.planner import ModelSpec
from supervisor.schema import BUNDLED_VERSION, FlagSchema, FlagSpec, load_bundled
from supervisor.sim import capacity
from supervisor.sim.faults import FAULTS_ENV, Faults, crash_report, oom_report, parse_faults
from supervisor.sim.gpus import DEFAULT_MEMORY_MIB, sim_gpu_index, sim_gpu_uuid
from supervisor.sim.load import LOAD_ENV, Engine, LoadSpec, parse_load

#: Seconds between time-driven checks of the main loop (children alive, faults, logging).
TICK_S = 0.1
#: SIGTERM -> SIGKILL grace for the ranks and the detokenizer at shutdown.
CHILD_GRACE_S = 5.0
#: Upper bound on waiting for in-flight requests at shutdown (SGLang has none; the
#: supervisor's stop grace is the real bound).
DRAIN_TIMEOUT_S = 60.0
#: How long the ranks may take to start and register their memory.
REGISTER_TIMEOUT_S = 30.0
#: Interval of the "Decode batch" log line while requests run.
DECODE_LOG_S = 1.0
#: A real /health_generate runs a one-token generation: a few milliseconds.
HEALTH_GENERATE_S = 0.005
DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_CONTEXT_LENGTH = 131072
MAX_BODY_BYTES = 16 * 2**20

_LOG_LOCK = threading.Lock()


def log(message: str, who: str = "") -> None:
    """One SGLang-shaped line on stdout: ``[2026-11-29 08:00:00 TP0] message``."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    tag = f" {who}" if who else ""
    with _LOG_LOCK:
        try:
            sys.stdout.write(f"[{stamp}{tag}] {message}\n")
            sys.stdout.flush()
        except (OSError, ValueError):
            pass  # nowhere to log to; the server keeps running


# --- flags -----------------------------------------------------------------------------


def _shadowed_specs(schema: FlagSchema) -> list[FlagSpec]:
    """Actions the schema folds away because they share a dest with a real flag (a
    deprecated spelling); SGLang's parser still accepts them, so the simulator must too."""
    path = resources.files("supervisor").joinpath(f"data/sglang-{schema.sglang_version}.json")
    raw = json.loads(path.read_text())
    known = set(schema.by_option())
    extra = FlagSchema.from_probe_output(
        {
            "sglang_version": schema.sglang_version,
            "flags": [f for f in raw["flags"] if not known.intersection(f["option_strings"])],
        },
        source=schema.source,
    )
    return list(extra.flags.values())


def _count(text: str) -> int:
    value = planner.parse_count(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (4096, 128k, 1Mi)")
    return value


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON: {exc}") from None


#: Value parsers per schema type: SGLang's own ones refuse text they cannot read, and so
#: does the simulation (the others take any text, as those parsers do).
_VALUE_TYPES: dict[str, Any] = {
    "int": int,
    "float": float,
    "callable:human_readable_int": _count,
    "callable:loads": _json,
    "callable:json_list_type": _json,  # SGLang's json_list_type is JSON of any shape
}


def build_parser(schema: FlagSchema | None = None) -> argparse.ArgumentParser:
    """An argparse parser accepting exactly the flags of ``schema`` (default: bundled)."""
    schema = schema or load_bundled()
    parser = argparse.ArgumentParser(
        prog="python -m sglang.launch_server",
        description=f"Simulated SGLang {schema.sglang_version} server.",
    )
    for spec in [*schema.flags.values(), *_shadowed_specs(schema)]:
        kwargs: dict[str, Any] = {
            "dest": spec.dest,
            "default": spec.default,
            "help": spec.help.replace("%", "%%"),  # argparse formats help with %
        }
        options = list(spec.option_strings)
        if spec.boolean in ("store_true", "flag"):
            kwargs["action"] = "store_true"
        elif spec.boolean == "store_false":
            kwargs["action"] = "store_false"
        elif spec.boolean == "boolean_optional":
            kwargs["action"] = argparse.BooleanOptionalAction
            # The action adds each "--no-x" itself; giving it again would conflict.
            positive = {"--no-" + o[2:] for o in options if o.startswith("--")}
            options = [o for o in options if o not in positive]
        else:
            value_type = _VALUE_TYPES.get(spec.type)
            if value_type is not None:
                kwargs["type"] = value_type
            if spec.nargs is not None:
                kwargs["nargs"] = spec.nargs
            if spec.choices is not None:
                kwargs["choices"] = list(spec.choices)
        parser.add_argument(*options, **kwargs)
    return parser


@dataclass(frozen=True)
class ServerConfig:
    """The parsed flags the simulation acts on (all of them are kept in ``args``)."""

    args: dict[str, Any]
    host: str
    port: int
    enable_metrics: bool
    model_path: str
    served_model_name: str
    tp_size: int
    dp_size: int
    pp_size: int
    kv_cache_dtype: str
    max_running_requests: int | None
    base_gpu_id: int
    gpu_id_step: int
    cuda_graph: bool
    enable_hierarchical_cache: bool
    hicache_size_gb: int
    hicache_ratio: float | None
    context_length: int

    @property
    def layout(self) -> Layout:
        return Layout.of(self.args)

    @property
    def num_ranks(self) -> int:
        return self.layout.ranks

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> ServerConfig:
        a = vars(ns)
        return cls(
            args=dict(a),
            host=str(a["host"]),
            port=int(a["port"]),
            enable_metrics=bool(a["enable_metrics"]),
            model_path=str(a["model_path"]),
            served_model_name=str(a.get("served_model_name") or a["model_path"]),
            tp_size=max(1, int(a.get("tp_size") or 1)),
            dp_size=max(1, int(a.get("dp_size") or 1)),
            pp_size=max(1, int(a.get("pp_size") or 1)),
            kv_cache_dtype=str(a.get("kv_cache_dtype") or "auto"),
            max_running_requests=a.get("max_running_requests"),
            base_gpu_id=int(a.get("base_gpu_id") or 0),
            gpu_id_step=max(1, int(a.get("gpu_id_step") or 1)),
            cuda_graph=not a.get("disable_cuda_graph")
            and not a.get("disable_decode_cuda_graph")
            and a.get("cuda_graph_backend_decode") != "disabled",
            enable_hierarchical_cache=bool(a.get("enable_hierarchical_cache")),
            hicache_size_gb=int(a.get("hicache_size") or 0),
            hicache_ratio=a.get("hicache_ratio"),
            context_length=planner.parse_count(a.get("context_length")) or DEFAULT_CONTEXT_LENGTH,
        )


@dataclass(frozen=True)
class SimEnv:
    """The simulation's knobs, read from the server's environment."""

    visible_gpus: list[str]
    registry: Path
    memory_mib: int
    oom_fraction: float
    startup_s: float
    faults: Faults
    load: LoadSpec | None = None

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 2**20

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> SimEnv:
        """Raises ``ValueError`` naming the variable that is missing or malformed."""
        registry = env.get("SGLANG_SIM_GPU_DIR")
        if not registry:
            raise ValueError(
                "SGLANG_SIM_GPU_DIR is not set: the simulated server needs the directory "
                "of the simulated GPU registry (the supervisor sets it in --simulate mode)"
            )
        visible = env.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            gpus = [sim_gpu_uuid(i) for i in range(8)]
        else:
            items = [v.strip() for v in visible.split(",") if v.strip()]
            gpus = [sim_gpu_uuid(int(v)) if v.isdigit() else v for v in items]
        return cls(
            visible_gpus=gpus,
            registry=Path(registry),
            memory_mib=int(_number(env, "SGLANG_SIM_GPU_MEMORY_MIB", DEFAULT_MEMORY_MIB, 1)),
            oom_fraction=_number(env, "SGLANG_SIM_OOM_FRACTION", 0.95, 0.0),
            startup_s=_number(env, "SGLANG_SIM_STARTUP_S", 1.5, 0.0),
            faults=parse_faults(env.get(FAULTS_ENV, "")),
            load=parse_load(env.get(LOAD_ENV, "")),
        )


def _number(env: Mapping[str, str], name: str, default: float, minimum: float) -> float:
    text = env.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name}={text!r} is not a number >= {minimum:g}")
    return value


class _SglangMetrics(Collector):
    """SGLang's metric names, read from the engine at scrape time."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self._engine = engine
        self._model = model_name

    def collect(self) -> Iterator[Metric]:
        s = self._engine.stats()
        gauges: list[tuple[str, str, float]] = [
            ("sglang:num_running_reqs", "The number of running requests.", s.running),
            ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", s.queued),
            ("sglang:num_used_tokens", "The number of used tokens.", s.tokens),
            ("sglang:token_usage", "The token usage.", s.token_usage),
            ("sglang:gen_throughput", "The generation throughput (token/s).", s.gen_throughput),
            ("sglang:cache_hit_rate", "The prefix cache hit rate.", s.cache_hit_rate),
            (
                "sglang:max_total_num_tokens",
                "Maximum total number of tokens in the KV cache pool.",
                self._engine.max_total_num_tokens,
            ),
        ]
        for name, doc, value in gauges:
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric([self._model], value)
            yield g
        counters: list[tuple[str, str, float]] = [
            ("sglang:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens_total),
            (
                "sglang:generation_tokens",
                "Number of generation tokens processed.",
                s.generation_tokens_total,
            ),
        ]
        for name, doc, value in counters:
            c = CounterMetricFamily(name, doc, labels=["model_name"])
            c.add_metric([self._model], value)
            yield c


# --- HTTP ------------------------------------------------------------------------------


class Phase(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], app: Launcher) -> None:
        host = address[0]
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.app = app
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, which can stall on DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = int(self.server_address[1])


class _Handler(BaseHTTPRequestHandler):
    # Headers and body go out in separate writes: with Nagle's algorithm on, a kept-alive
    # client's delayed ACK would hold every answer back ~40 ms.
    disable_nagle_algorithm = True
    # A client that sends half a request must not hold a thread forever.
    timeout = 30
    protocol_version = "HTTP/1.1"
    server: _HttpServer

    def log_message(self, format: str, *args: Any) -> None:
        log(f"INFO:     {self.client_address[0]} - {format % args}")

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        try:
            phrase = HTTPStatus(int(code)).phrase
        except ValueError:
            phrase = ""
        log(
            f'INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" '
            f"{code} {phrase}"
        )

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, data: object) -> None:
        self._send(status, json.dumps(data).encode())

    def do_GET(self) -> None:
        app = self.server.app
        path = self.path.split("?", 1)[0]
        if path == "/health":
            ok = app.phase is Phase.READY
            self._send(200 if ok else 503, b"" if ok else b"not ready", "text/plain")
        elif path == "/health_generate":
            if app.phase is Phase.READY and app.healthy:
                time.sleep(HEALTH_GENERATE_S)  # a one-token generation
                self._send(200, b"OK", "text/plain")
            else:
                why = "unhealthy" if app.phase is Phase.READY else app.phase.value
                self._send(503, why.encode(), "text/plain")
        elif path in ("/get_server_info", "/server_info"):
            self._json(200, app.server_info())
        elif path in ("/get_model_info", "/model_info"):
            cfg = app.cfg
            self._json(200, {"model_path": cfg.model_path, "is_generation": True})
        elif path == "/v1/models":
            self._json(200, app.models())
        elif path == "/metrics":
            if app.cfg.enable_metrics:
                self._send(200, app.metrics_text(), "text/plain; version=0.0.4; charset=utf-8")
            else:
                self._json(404, {"detail": "Not Found"})
        else:
            self._json(404, {"detail": "Not Found"})

    do_HEAD = do_GET

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            self.close_connection = True
            self._json(400, {"error": {"message": "bad Content-Length"}})
            return
        body = self.rfile.read(length)
        if path == "/generate":
            status, data = self.server.app.generate(body)
            self._json(status, data)
        else:
            self._json(404, {"detail": "Not Found"})


# --- the launcher ----------------------------------------------------------------------


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"#{signum}"


class ServerFailure(Exception):
    """The server cannot start or go on (OOM, a fault, a dead child); ``lines`` say why."""

    def __init__(self, lines: list[str], who: str = "") -> None:
        super().__init__(lines[-1] if lines else "start-up failed")
        self.lines = lines
        self.who = who


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]


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
        self._children: list[Child] = []
        self._ranks: list[Child] = []
        self._http: _HttpServer | None = None
        self._ready_at: float | None = None
        self._last_decode_log = 0.0

        # The planner's math, on the parsed flags: plan and simulation agree exactly.
        total, shape = env.memory_bytes, self.model.shape
        self.mem_fraction = planner.effective_fraction(total, cfg.args, shape.is_mla)
        self.cell_bytes = capacity.cell_bytes(
            self.model, cfg.tp_size, cfg.kv_cache_dtype, cfg.pp_size
        )
        self.weight_bytes = capacity.weight_bytes_per_rank(self.model, cfg.tp_size, cfg.pp_size)
        self.rank_bytes = int(self.mem_fraction * total)
        tokens = planner.pool_tokens(self.model, cfg.args, total)
        self.max_total_num_tokens = tokens
        self.host_pool_tokens = 0
        if cfg.enable_hierarchical_cache:
            self.host_pool_tokens = planner.host_pool_tokens(
                cfg.hicache_size_gb, cfg.hicache_ratio, tokens, self.cell_bytes
            )
        # SGLang derives the default from the pool size; any monotone rule will do here.
        max_running = cfg.max_running_requests or min(1024, max(1, tokens // 512))
        graph_bs = planner.decode_max_bs(total, cfg.args) if cfg.cuda_graph else None
        self.engine = Engine(
            tokens,
            max_running,
            host_cache_tokens=self.host_pool_tokens,
            decode_graph_max_bs=graph_bs,
            load=env.load,
        )
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(_SglangMetrics(self.engine, cfg.served_model_name))

    # -- what the HTTP handlers read --

    def server_info(self) -> dict[str, Any]:
        info = dict(self.cfg.args)
        info.update(
            mem_fraction_static=self.mem_fraction,
            max_total_num_tokens=self.max_total_num_tokens,
            max_running_requests=self.engine.max_running,
            version=BUNDLED_VERSION,
            simulated=True,
            internal_states=[
                {
                    "max_total_num_tokens": self.max_total_num_tokens,
                    "max_running_requests": self.engine.max_running,
                }
            ],
        )
        return info

    def models(self) -> dict[str, Any]:
        name = self.cfg.served_model_name
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "sglang",
                    "root": self.cfg.model_path,
                    "max_model_len": self.cfg.context_length,
                }
            ],
        }

    def metrics_text(self) -> bytes:
        return generate_latest(self._registry)

    def generate(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """``POST /generate``: (status, JSON answer)."""
        if self.phase is not Phase.READY:
            return 503, {"error": {"message": f"the server is {self.phase.value}"}}
        try:
            req = json.loads(body or b"{}")
            if not isinstance(req, dict):
                raise ValueError("the body must be a JSON object")
            params = req.get("sampling_params") or {}
            max_new = int(params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS))
            if "input_ids" in req and "text" not in req:
                ids = req["input_ids"]
                if not isinstance(ids, list):
                    raise ValueError("input_ids must be a list of token ids")
                prompt, prompt_tokens = json.dumps(ids), len(ids)
            else:
                prompt = req.get("text", "")
                if not isinstance(prompt, str):
                    raise ValueError("text must be a string (batches are not simulated)")
                prompt_tokens = max(1, len(prompt) // 4)
        except (ValueError, TypeError, AttributeError) as exc:
            return 400, {"error": {"message": f"invalid /generate request: {exc}"}}
        if max_new < 0 or prompt_tokens + max_new > self.cfg.context_length:
            return 400, {
                "error": {
                    "message": f"requested {prompt_tokens + max_new} tokens, more than the "
                    f"context length {self.cfg.context_length}"
                }
            }
        result = self.engine.generate(prompt, prompt_tokens, max_new)
        if result is None:
            return 503, {"error": {"message": "the server is shutting down"}}
        return 200, {
            "text": " ".join(["sim"] * result.completion_tokens),
            "meta_info": {
                "id": uuid.uuid4().hex,
                "prompt_tokens": result.prompt_tokens,
                "completion_tokens": result.completion_tokens,
                "cached_tokens": result.cached_tokens,
                "finish_reason": {"type": "length", "length": result.completion_tokens},
                "e2e_latency": round(result.latency_s, 4),
            },
        }

    # -- lifecycle --

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (exit 0) or a failure (exit 1)."""
        self._install_signals()
        try:
            self._http = _HttpServer((self.cfg.host, self.cfg.port), self)
        except OSError as exc:
            log(
                f"ERROR: cannot bind the HTTP server to {self.cfg.host}:{self.cfg.port}: "
                f"{exc.strerror or exc}"
            )
            return 1
        threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        args_text = ", ".join(f"{k}={v!r}" for k, v in self.cfg.args.items())
        log(f"server_args=ServerArgs({args_text})")
        try:
            self._serve()
        except ServerFailure as exc:
            return self._fail(exc.lines, exc.who)
        except Exception as exc:  # a bug or an OS error: never leave the ranks behind
            return self._fail([f"{type(exc).__name__}: {exc}"], "")
        return self._shutdown()

    def _serve(self) -> None:
        """Spawn, load, become ready and serve; return when a stop signal arrives."""
        self._check_gpus()
        self._spawn_children()
        if self._wait_registered():
            return
        log(f"Load weight begin. avail mem={self.env.memory_bytes / 2**30:.2f} GB", "TP0")
        if self._wait(time.monotonic() + self.env.startup_s):
            return
        self._check_start_faults()
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

    def _check_gpus(self) -> None:
        """Every rank needs its own visible GPU, as SGLang's ranks do."""
        cfg, visible = self.cfg, self.env.visible_gpus
        last = cfg.layout.gpus_needed - 1
        unknown = [g for g in visible if sim_gpu_index(g) is None]
        if unknown:
            raise ServerFailure(
                [
                    f"RuntimeError: CUDA error: invalid device ordinal: CUDA_VISIBLE_DEVICES "
                    f"names {', '.join(unknown)}, which is not a simulated GPU"
                ]
            )
        if not visible or last >= len(visible):
            raise ServerFailure(
                [
                    f"RuntimeError: {cfg.num_ranks} ranks (tp_size={cfg.tp_size} × "
                    f"dp_size={cfg.dp_size} × pp_size={cfg.pp_size}) need GPU ids up to "
                    f"{last} (base_gpu_id={cfg.base_gpu_id}, gpu_id_step={cfg.gpu_id_step}), "
                    f"but only {len(visible)} GPUs are visible "
                    f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})"
                ]
            )

    def _rank_argv(self, extra: Sequence[str]) -> list[str]:
        argv = [sys.executable, "-m", "supervisor.sim.rank", "--registry", str(self.env.registry)]
        if self.faults.ignore_sigterm:
            argv.append("--ignore-sigterm")
        if self.faults.detach_ranks:
            argv.append("--setsid")
        return [*argv, *extra]

    def _spawn_children(self) -> None:
        """One child per rank, plus the detokenizer; they inherit env, stdout and group."""
        self.env.registry.mkdir(parents=True, exist_ok=True)
        plan: list[tuple[str, list[str]]] = []
        for r in range(self.cfg.num_ranks):
            gpu = self.env.visible_gpus[self.cfg.layout.gpu_ids[r]]
            plan.append(
                (f"TP{r}", ["--rank", str(r), "--gpu-uuid", gpu, "--bytes", str(self.rank_bytes)])
            )
        plan.append(("detokenizer", ["--detokenizer"]))
        for name, extra in plan:
            try:
                popen = subprocess.Popen(self._rank_argv(extra), stdin=subprocess.DEVNULL)
            except OSError as exc:
                raise ServerFailure([f"RuntimeError: cannot start {name}: {exc}"]) from exc
            child = Child(name, popen)
            self._children.append(child)
            if name != "detokenizer":
                self._ranks.append(child)

    def _wait_registered(self) -> bool:
        """Wait for every rank's registry entry. True when a stop signal came first."""
        deadline = time.monotonic() + REGISTER_TIMEOUT_S
        pending = list(self._ranks)
        while pending:
            pending = [
                c for c in pending if not (self.env.registry / f"{c.popen.pid}.json").exists()
            ]
            if not pending:
                break
            if time.monotonic() >= deadline:
                names = ", ".join(f"{c.name} (pid {c.popen.pid})" for c in pending)
                raise ServerFailure(
                    [f"RuntimeError: ranks did not start within {REGISTER_TIMEOUT_S:.0f}s: {names}"]
                )
            if self._wait(time.monotonic() + 0.02):
                return True
        return False

    def _check_start_faults(self) -> None:
        if self.mem_fraction > self.env.oom_fraction:
            raise ServerFailure(
                oom_report(self.env.memory_bytes, self.mem_fraction, self.env.oom_fraction),
                "TP0",
            )
        if self.faults.crash_on_start:
            raise ServerFailure(crash_report(), "TP0")
        if self.max_total_num_tokens <= 0:
            weights_gib = self.weight_bytes / 2**30
            raise ServerFailure(
                [
                    f"RuntimeError: Not enough memory. Please try to increase "
                    f"--mem-fraction-static. (weights {weights_gib:.1f} GiB per rank leave no "
                    f"room for the KV cache at mem_fraction_static={self.mem_fraction:.3f})"
                ],
                "TP0",
            )

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
            log(f"Received {_signal_name(signum)}; shutting down")
            return True

    def _tick(self) -> None:
        for child in self._children:
            rc = child.popen.poll()
            if rc is not None:
                how = f"exit code {rc}" if rc >= 0 else f"signal {_signal_name(-rc)}"
                raise ServerFailure(
                    [
                        f"{child.name} (pid {child.popen.pid}) exited unexpectedly "
                        f"({how}); killing the server's processes"
                    ]
                )
        if self.phase is not Phase.READY or self._ready_at is None:
            return
        now = time.monotonic()
        since_ready = now - self._ready_at
        if self.faults.crash_after is not None and since_ready >= self.faults.crash_after:
            pids = [c.popen.pid for c in self._children]
            log(
                f"(simulated fault crash_after={self.faults.crash_after:g}: launcher pid "
                f"{os.getpid()} dies abruptly; children {pids} are left running)"
            )
            os._exit(1)
        if (
            self.healthy
            and self.faults.unhealthy_after is not None
            and since_ready >= self.faults.unhealthy_after
        ):
            self.healthy = False
            log(
                f"(simulated fault unhealthy_after={self.faults.unhealthy_after:g}: "
                "/health_generate now answers 503)"
            )
        self.engine.tick(now)
        self._log_decode()

    def _log_decode(self) -> None:
        """SGLang's periodic "Decode batch" line, while requests run or wait."""
        now = time.monotonic()
        if now - self._last_decode_log < DECODE_LOG_S:
            return
        s = self.engine.stats()
        if s.running or s.queued:
            self._last_decode_log = now
            log(
                f"Decode batch, #running-req: {s.running}, #token: {s.tokens}, "
                f"token usage: {s.token_usage:.2f}, cuda graph: {s.cuda_graph}, "
                f"gen throughput (token/s): {s.gen_throughput:.2f}, #queue-req: {s.queued}",
                "TP0",
            )

    def _set_phase(self, new: Phase, reason: str) -> None:
        log(f"simulated server: {self.phase.value} -> {new.value} ({reason})")
        self.phase = new

    def _shutdown(self) -> int:
        """Drain (bounded), stop HTTP, stop the children with escalation; exit status 0."""
        # ready/loading -> draining
        self._set_phase(Phase.DRAINING, "stop signal")
        aborted = self.engine.close()
        if aborted:
            log(f"Aborted {aborted} synthetic requests (the load's clients disconnect)")
        inflight = self.engine.inflight()
        if inflight:
            log(f"Gracefully exiting... remaining number of requests {inflight}")
            deadline = time.monotonic() + DRAIN_TIMEOUT_S
            while not self.engine.wait_idle(min(TICK_S, max(0.0, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    log(
                        f"{self.engine.inflight()} requests still running after "
                        f"{DRAIN_TIMEOUT_S:.0f}s; aborting them"
                    )
                    break
                self._log_decode()
        # draining -> stopping
        self._set_phase(Phase.STOPPING, "drained")
        self._stop_http()
        self._stop_children(CHILD_GRACE_S)
        log("Shutdown complete.")
        return 0

    def _fail(self, lines: list[str], who: str) -> int:
        for line in lines:
            log(line, who)
        log("A server process failed; killing the simulated server's processes (exit 1)")
        self._stop_http()
        self._stop_children(0.0)
        return 1

    def _stop_http(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    def _stop_children(self, grace_s: float) -> None:
        """SIGTERM every child (none when ``grace_s`` is 0), wait up to ``grace_s``, then
        SIGKILL the stragglers and reap them all."""
        if grace_s > 0:
            for child in self._children:
                child.popen.send_signal(signal.SIGTERM)  # no-op once reaped
            deadline = time.monotonic() + grace_s
            for child in self._children:
                try:
                    child.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log(
                        f"{child.name} (pid {child.popen.pid}) ignored SIGTERM for "
                        f"{grace_s:.0f}s; sending SIGKILL"
                    )
        for child in self._children:
            child.popen.kill()  # no-op once reaped
        for child in self._children:
            try:
                child.popen.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                log(
                    f"{child.name} (pid {child.popen.pid}) survived SIGKILL for 10s "
                    "(D-state?); leaving it"
                )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse SGLang's flags and the simulation's environment, then serve."""
    parser = build_parser()
    ns = parser.parse_args(list(sys.argv[1:] if argv is None else argv))  # exits 2 on error
    if ns.model_path is None:
        parser.error("the following arguments are required: --model-path/--model")
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # the ranks share this log
    try:
        env = SimEnv.from_environ(os.environ)
        model = capacity.resolve_model(str(ns.model_path), os.environ)
    except ValueError as exc:  # PlanError is one
        log(f"ERROR: {exc}")
        return 1
    return Launcher(ServerConfig.from_namespace(ns), env, model).run()


if __name__ == "__main__":
    sys.exit(main())
