"""What a lever set must satisfy to be able to start at all, checked before anything stops.

* Text: every lever name, value, list item and env name/value must be encodable into an
  argv/environment (strict UTF-8: no lone UTF-16 surrogates such as ``"\\ud800"``, no
  NUL byte) and bounded in size: one value at most ``MAX_VALUE_BYTES``, a list at most
  ``MAX_LIST_ITEMS`` items, the rendered argv plus the lever env at most
  ``MAX_LAUNCH_BYTES`` (Linux refuses a single argument over 128 KiB and a whole
  argv + environment over ``ARG_MAX``, 2 MiB here; the bounds leave room for the
  daemon's own environment).
* Ranges SGLang 0.5.23 needs but does not check before it loads the model (``RANGES``),
  and every port-valued lever (``*_port``, ``dist_init_addr``'s port) within SGLang's
  own 0-65535 (``port_problems``).
* GPU ids: with ``base_gpu_id`` / ``gpu_id_step`` every rank's GPU id must be one of the
  managed GPUs (``check_gpu_ids``, given the managed GPU count).
* The launch's topology (``launch_topology_problems``): no port-valued lever on the
  server's port or the daemon's API port.
* What the daemon's probes need (``probe_problems``): a server that answers plain HTTP
  on ``server.host:server.port`` — no TLS, no gRPC in its place.
* The server's environment: ``sglang_supervisor.sglang.lever_env``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from sglang_supervisor.sglang.layout import MAX_RANKS, Layout

MAX_VALUE_BYTES = 16 * 1024
MAX_LIST_ITEMS = 4096
MAX_LAUNCH_BYTES = 256 * 1024

#: (lower bound, inclusive?, upper bound, inclusive?, why) per lever dest.
RANGES: dict[str, tuple[float | None, bool, float | None, bool, str]] = {
    "mem_fraction_static": (0.0, False, 1.0, True, "a fraction of each GPU's memory"),
    "tp_size": (1, True, None, True, "ranks of tensor parallelism"),
    "pp_size": (1, True, None, True, "pipeline stages"),
    "dp_size": (1, True, None, True, "data-parallel replicas"),
    "attn_dp_size": (1, True, None, True, "attention data-parallel groups"),
    "ep_size": (1, True, None, True, "expert-parallel ranks"),
    "nnodes": (1, True, None, True, "nodes"),
    "max_running_requests": (1, True, None, True, "requests decoding at once"),
    "max_total_tokens": (1, True, None, True, "tokens in the KV pool"),
    "max_prefill_tokens": (1, True, None, True, "tokens in one prefill batch"),
    "page_size": (1, True, None, True, "tokens per KV page (SGLang divides by it)"),
    "context_length": (1, True, None, True, "tokens of context"),
    "stream_interval": (1, True, None, True, "tokens between streamed chunks"),
    "base_gpu_id": (0, True, None, True, "SGLang: 'base_gpu_id must be non-negative'"),
    "gpu_id_step": (1, True, None, True, "SGLang: 'gpu_id_step must be positive'"),
    "hicache_size": (0, True, None, True, "GB of host memory per rank"),
    "hicache_ratio": (0.0, False, None, True, "host pool size relative to the device pool"),
    "schedule_conservativeness": (0.0, True, None, True, "SGLang: must be non-negative"),
    # SGLang asserts >= 1 (arg_groups/validation_hook.py:273-274) and starts that many
    # processes (uvicorn workers: entrypoints/http_server.py:3062): no host runs more.
    "tokenizer_worker_num": (1, True, MAX_RANKS, True, "tokenizer processes"),
    "detokenizer_worker_num": (1, True, MAX_RANKS, True, "detokenizer processes"),
}
#: SGLang's own port range (``utils/network.py:61`` ``MAX_VALID_PORT``, ``:536``).
MAX_PORT = 65535
#: Flags without which SGLang's parser refuses to start.
REQUIRED = ("model_path",)


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot travel in an argv or environment, or None."""
    if "\x00" in text:
        return "a value cannot contain a NUL byte"
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return (
            f"contains {text[exc.start : exc.end]!a} at position {exc.start}, which has "
            "no UTF-8 encoding (a lone UTF-16 surrogate): it cannot be passed in an argv or "
            "environment"
        )
    if size > MAX_VALUE_BYTES:
        return f"is {size} bytes long; at most {MAX_VALUE_BYTES} bytes are accepted per value"
    return None


def shown(text: str) -> str:
    """``text`` safe to echo in a JSON answer (escaped when it cannot be encoded)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return ascii(text)[1:-1]
    return text[:200] + ("..." if len(text) > 200 else "")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def required_problems(levers: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(lever, message) for each flag a whole lever set lacks that SGLang requires."""
    out: list[tuple[str, str]] = []
    for name in REQUIRED:
        value = levers.get(name)
        if value is None or (isinstance(value, str) and not value.strip()):
            out.append((name, f"{name} is required: SGLang's parser refuses to start without it"))
    return out


def range_problems(levers: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(lever, message) for each value outside what SGLang can start with."""
    out: list[tuple[str, str]] = []
    out.extend(port_problems(levers))
    for name, (lo, lo_incl, hi, hi_incl, why) in RANGES.items():
        if name not in levers:
            continue
        f = _number(levers[name])
        if f is None:
            continue
        low_bad = lo is not None and (f < lo or (f == lo and not lo_incl))
        high_bad = hi is not None and (f > hi or (f == hi and not hi_incl))
        if low_bad or high_bad:
            lower = "" if lo is None else f"{'≥' if lo_incl else '>'} {lo:g}"
            upper = "" if hi is None else f"{'≤' if hi_incl else '<'} {hi:g}"
            bounds = " and ".join(b for b in (lower, upper) if b)
            out.append((name, f"{name} {levers[name]!r} is out of range: must be {bounds} ({why})"))
    return out


def port_problems(levers: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(lever, message) for a port-valued lever outside SGLang's 0-65535, and for a
    ``dist_init_addr`` SGLang cannot parse as ``host:port`` (``NetworkAddress.parse``,
    ``utils/network.py:600-645``). SGLang checks a port's range only where it binds it
    (``wait_port_available``, after the stop) or not at all."""
    out: list[tuple[str, str]] = []
    for name, value in levers.items():
        if name == "dist_init_addr":
            problem = _address_problem(value)
            if problem is not None:
                out.append((name, f"dist_init_addr {value!r} {problem}"))
            continue
        if not name.endswith("_port"):
            continue
        f = _number(value)
        if f is not None and not 0 <= f <= MAX_PORT:
            out.append(
                (name, f"{name} {value!r} is not a TCP port: must be 0-{MAX_PORT} (SGLang's range)")
            )
    return out


def _address_problem(value: Any) -> str | None:
    """Why SGLang cannot read ``value`` as ``host:port`` (IPv6 in brackets), or None."""
    if not isinstance(value, str):
        return None
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        if not host or not rest.startswith(":"):
            return "is not host:port (an IPv6 address is written [addr]:port)"
        port_text = rest[1:]
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep or not host:
            return "is not host:port: SGLang needs the host and the port"
        if ":" in host:
            return "is ambiguous: write an IPv6 address in brackets, [addr]:port"
    try:
        port = int(port_text)
    except ValueError:
        return f"has no port number after ':' ({port_text!r})"
    if not 0 <= port <= MAX_PORT:
        return f"has port {port}, which is not a TCP port: must be 0-{MAX_PORT} (SGLang's range)"
    return None


def probe_problems(levers: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(lever, message) for levers that make the server answer something other than
    plain HTTP on its port, where the daemon probes ``/health_generate``: it would never
    be seen ready. ``ssl_certfile`` + ``ssl_keyfile`` serve HTTPS (SGLang refuses either
    alone: ``arg_groups/serving_hook.py:50-57``; ``entrypoints/http_server.py:2916-2943``);
    ``grpc_mode`` / ``smg_grpc_mode`` serve gRPC instead of HTTP (``launch_server.py:44``)."""
    out: list[tuple[str, str]] = []
    tls = [name for name in ("ssl_certfile", "ssl_keyfile") if levers.get(name)]
    if tls:
        out.append(
            (
                tls[0],
                f"{' and '.join(tls)} would make the server answer HTTPS only, but this "
                "daemon (and its router) reach it over plain HTTP at server.host:server.port: "
                "it would never be seen ready. Leave them unset and terminate TLS in front "
                "of the server (a router or proxy)",
            )
        )
    for name in ("grpc_mode", "smg_grpc_mode"):
        if levers.get(name) is True:
            out.append(
                (
                    name,
                    f"{name} makes the server answer gRPC instead of HTTP on its port, where "
                    "this daemon probes /health_generate: it would never be seen ready. "
                    "Leave it unset (grpc_port starts SGLang's native gRPC server beside HTTP)",
                )
            )
    return out


def check_gpu_ids(levers: Mapping[str, Any], managed_count: int) -> list[tuple[str, str]]:
    """(lever, message) when ``base_gpu_id``/``gpu_id_step`` place a rank on a GPU id
    outside the ``managed_count`` managed GPUs (ids are relative to them: 0..count-1)."""
    if "base_gpu_id" not in levers and "gpu_id_step" not in levers:
        return []
    shape = Layout.of(levers)
    if shape.base_gpu_id < 0 or shape.gpu_id_step < 1:
        return []  # range_problems names these
    outside = shape.gpu_ids_outside(managed_count)
    if not outside:
        return []
    plain = Layout.of({k: v for k, v in levers.items() if k not in ("base_gpu_id", "gpu_id_step")})
    if plain.gpus_needed > managed_count:
        return []  # too many ranks whatever the placement: preflight names tp/pp/dp
    lever = "base_gpu_id" if shape.base_gpu_id > 0 else "gpu_id_step"
    return [
        (
            lever,
            f"{shape.describe()} puts ranks on GPU id(s) {', '.join(map(str, outside))}, "
            f"outside the {managed_count} managed GPUs (ids 0-{managed_count - 1}); lower "
            "base_gpu_id/gpu_id_step or add GPUs to server.gpus",
        )
    ]


def launch_size_problem(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why the rendered argv plus the lever env is too large to exec, or None."""
    total = sum(len(a.encode("utf-8", "replace")) + 1 for a in argv) + sum(
        len(k) + len(v.encode("utf-8", "replace")) + 2 for k, v in env.items()
    )
    if total > MAX_LAUNCH_BYTES:
        return (
            f"the server's argv and lever env come to {total} bytes; at most "
            f"{MAX_LAUNCH_BYTES} are accepted"
        )
    return None


def _port_of(name: str, value: Any) -> int | None:
    if name == "dist_init_addr" and isinstance(value, str) and ":" in value:
        value = value.rsplit(":", 1)[1]
    elif not name.endswith("_port"):
        return None
    f = _number(value)
    return int(f) if f is not None and f == int(f) else None


def launch_topology_problems(
    levers: Mapping[str, Any], *, server_port: int, api_port: int
) -> list[tuple[str, str]]:
    """(lever, message) for what one host's launch can never satisfy: a port-valued lever
    (``nccl_port``, ``*_port``, ``dist_init_addr``'s port) on the server's own port or
    the daemon's API port. (``nnodes`` is the launcher's rule: ``slurm.settings``.)"""
    out: list[tuple[str, str]] = []
    taken = {server_port: "the server's own port (server.port)"}
    if api_port:
        taken.setdefault(api_port, "this daemon's API port (api.port)")
    for name, value in levers.items():
        port = _port_of(name, value)
        if port is not None and port in taken:
            out.append(
                (
                    name,
                    f"{name} {value!r} uses port {port}, which is {taken[port]}: the server "
                    f"could not bind it; choose another port for {name} or leave it unset",
                )
            )
    return out
