"""The simulated server's inputs: SGLang's launch flags (a parser built from the bundled
0.5.23 schema) and the simulation's own ``SGLANG_SIM_*`` environment."""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sglang_supervisor import planner
from sglang_supervisor.planner.stopcost import MEASURED_RATES, PinRates
from sglang_supervisor.sglang.layout import Layout
from sglang_supervisor.sglang.schema import FlagSchema, FlagSpec, load_bundled
from sglang_supervisor.sim.faults import FAULTS_ENV, Faults, parse_faults
from sglang_supervisor.sim.gpus import DEFAULT_MEMORY_MIB, sim_gpu_uuid
from sglang_supervisor.sim.load import DECODE_TOKENS_PER_S, LOAD_ENV, LoadSpec, parse_load
from sglang_supervisor.sim.workload import PREFILL_TOKENS_PER_S

DEFAULT_CONTEXT_LENGTH = 131072
#: SGLang's /health and /health_generate run a one-token generation and poll for its
#: answer once a second (http_server.py health_generate: ``await asyncio.sleep(1)``).
DEFAULT_HEALTH_S = 1.0
#: SGLang's SIGTERM watchdog looks at the remaining requests every 5 s
#: (tokenizer_manager.py sigterm_watchdog: ``await asyncio.sleep(5)``).
DEFAULT_DRAIN_CHECK_S = 5.0

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


def _shadowed_specs(schema: FlagSchema) -> list[FlagSpec]:
    """Actions the schema folds away because they share a dest with a real flag (a
    deprecated spelling); SGLang's parser still accepts them, so the simulator must too."""
    path = resources.files("sglang_supervisor").joinpath(
        f"data/sglang-{schema.sglang_version}.json"
    )
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


def merge_config(argv: list[str]) -> list[str]:
    """``--config FILE`` as SGLang 0.5.23 reads it (``srt/server_args.py:683``,
    ``srt/utils/server_args_config_parser.py``): the file's flags first, then the command
    line's (which win), ``--config`` itself left out. The daemon writes its secret flags
    there as JSON (which is YAML): string values, keys spelt as options (``api-key``).
    Raises ``ValueError`` naming the file when it does not load."""
    if "--config" not in argv:
        return argv
    at = argv.index("--config")
    if at + 1 >= len(argv):
        raise ValueError("No config file specified after --config flag!")
    path = Path(argv[at + 1])
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the config file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    extra: list[str] = []
    for key, value in data.items():
        if value is True:
            extra.append(f"--{key}")
        elif value is not False:
            extra += [f"--{key}", str(value)]
    return [*extra, *argv[:at], *argv[at + 2 :]]


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
    startup_s: float
    faults: Faults
    load: LoadSpec | None = None
    #: Decode pace of one real request (tokens per second): how long generations last.
    tokens_per_s: float = DECODE_TOKENS_PER_S
    #: Prompt tokens per second of a prefill pass.
    prefill_tokens_per_s: float = PREFILL_TOKENS_PER_S
    #: How long /health and /health_generate take while the server is ready.
    health_s: float = DEFAULT_HEALTH_S
    #: Interval of the SIGTERM drain's checks of the remaining requests.
    drain_check_s: float = DEFAULT_DRAIN_CHECK_S
    #: Seconds per GiB of host pool to pin at start and to unpin at stop (``[sim]``).
    pins: PinRates = MEASURED_RATES

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
        if env.get("SGLANG_SIM_GPU_DIR_PER_NODE") == "1" and env.get("SLURMD_NODENAME"):
            # Each Slurm node has its own simulated GPUs (sglang_supervisor.slurm.nodeprobe).
            registry = str(Path(registry) / env["SLURMD_NODENAME"])
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
            startup_s=_number(env, "SGLANG_SIM_STARTUP_S", 1.5, 0.0),
            faults=parse_faults(env.get(FAULTS_ENV, "")),
            load=parse_load(env.get(LOAD_ENV, "")),
            tokens_per_s=_number(env, "SGLANG_SIM_TOKENS_PER_S", DECODE_TOKENS_PER_S, 0.01),
            prefill_tokens_per_s=_number(
                env, "SGLANG_SIM_PREFILL_TOKENS_PER_S", PREFILL_TOKENS_PER_S, 1.0
            ),
            health_s=_number(env, "SGLANG_SIM_HEALTH_S", DEFAULT_HEALTH_S, 0.0),
            drain_check_s=_number(env, "SGLANG_SIM_DRAIN_CHECK_S", DEFAULT_DRAIN_CHECK_S, 0.01),
            pins=sim_pin_rates(
                _number(env, "SGLANG_SIM_PIN_S_PER_GIB", MEASURED_RATES.pin_s_per_gib, 0.0),
                _number(env, "SGLANG_SIM_UNPIN_S_PER_GIB", MEASURED_RATES.unpin_s_per_gib, 0.0),
            ),
        )


def sim_pin_rates(pin_s_per_gib: float | None, unpin_s_per_gib: float | None) -> PinRates:
    """The simulated server's pinning rates: ``[sim] pin_s_per_gib`` / ``unpin_s_per_gib``
    where set, else the H200 figures (``planner.stopcost``), and whence."""
    pin = MEASURED_RATES.pin_s_per_gib if pin_s_per_gib is None else pin_s_per_gib
    unpin = MEASURED_RATES.unpin_s_per_gib if unpin_s_per_gib is None else unpin_s_per_gib
    if (pin, unpin) == (MEASURED_RATES.pin_s_per_gib, MEASURED_RATES.unpin_s_per_gib):
        return MEASURED_RATES
    return PinRates(pin, unpin, "the simulated server's [sim] pin_s_per_gib, unpin_s_per_gib")


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
