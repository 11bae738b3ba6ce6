"""Resource checks before anything is torn down: GPUs, host RAM, the port, the model path.

Every refusal carries its numbers and names the lever it is about, so the operator can
fix the request. Nothing here changes anything.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from sglang_supervisor.host.gpu import FOREIGN_ADVICE, GpuInfo, GpuSample, foreign_holders
from sglang_supervisor.planner.hicache import (
    SGLANG_HOST_RAM_MARGIN,
    auto_sized,
    available_host_ram_bytes,
    held_host_bytes,
    host_pool_bytes_per_rank,
)
from sglang_supervisor.planner.hostpool import DevicePool, describe, ratio_host_bytes_per_rank
from sglang_supervisor.sglang.layout import Layout
from sglang_supervisor.sglang.levers import LeverProblem, LeverSet
from sglang_supervisor.units import GB, GiB

log = logging.getLogger("supervisor")


def _int(levers: Mapping[str, Any], name: str, default: int = 1) -> int:
    value = levers.get(name, default)
    return int(value) if isinstance(value, (int, float, str)) and str(value).strip() else default


def gpus_needed(levers: Mapping[str, Any]) -> int:
    """Visible GPUs one server needs: its highest GPU id + 1
    (``sglang_supervisor.sglang.layout``)."""
    return Layout.of(levers).gpus_needed


def ranks(levers: Mapping[str, Any]) -> int:
    """Scheduler processes (ranks) of one server: dp × tp × pp
    (``sglang_supervisor.sglang.layout``)."""
    return Layout.of(levers).ranks


def pinned_host_bytes(
    levers: Mapping[str, Any], gpu_total_bytes: int, host_available_bytes: int | None = None
) -> int:
    """Pinned host RAM the server's hierarchical cache takes over all its ranks
    (``sglang_supervisor.planner.hicache``: SGLang's auto-sizing when neither size nor ratio)."""
    return ranks(levers) * host_pool_bytes_per_rank(levers, gpu_total_bytes, host_available_bytes)


@dataclass(frozen=True)
class HostFacts:
    available_ram_bytes: int
    #: "host" or "simulated".
    ram_source: str


def host_facts(simulated_ram_bytes: int | None) -> HostFacts:
    if simulated_ram_bytes is not None:
        return HostFacts(simulated_ram_bytes, "simulated")
    available, source = available_host_ram_bytes()
    return HostFacts(available, source)


def running_host_pool(
    levers: Mapping[str, Any],
    gpu_total_bytes: int,
    host: HostFacts,
    device_pool: DevicePool | None = None,
) -> tuple[HostFacts, int]:
    """The host as the new server would find it while the running server (``levers``)
    still holds its hierarchical cache, and the pinned bytes that cache frees at the stop
    (``sglang_supervisor.planner.hicache.held_host_bytes``: SGLang's auto-sizing rule, not ratio
    2.0). An explicit ``hicache_ratio`` is a multiple of the running server's device pool
    (``device_pool``, SGLang's sizing: ``sglang_supervisor.planner.hostpool``) where it is known.
    The simulated host's RAM is what is available with nothing of ours running: the
    running simulated server's pools, sized from it, are taken out first."""
    by_ratio = ratio_host_bytes_per_rank(levers, device_pool)
    if by_ratio:
        held = ranks(levers) * by_ratio
        if host.ram_source == "simulated":
            host = HostFacts(max(0, host.available_ram_bytes - held), host.ram_source)
        return host, held
    if host.ram_source == "simulated":
        taken = pinned_host_bytes(levers, gpu_total_bytes, host.available_ram_bytes)
        host = HostFacts(max(0, host.available_ram_bytes - taken), host.ram_source)
    return host, held_host_bytes(levers, gpu_total_bytes, host.available_ram_bytes)


def port_problem(host: str, port: int) -> str | None:
    """None when ``host:port`` can be bound now, else who holds it and what to do."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return f"cannot bind {host}:{port}: {exc.strerror}"
        else:
            return None
    holder = ""
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections("tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
                if conn.pid:
                    name = psutil.Process(conn.pid).name()
                    holder = f" by pid {conn.pid} ({name})"
                break
    return (
        f"server port {host}:{port} is in use{holder}; stop that process or set "
        "server.port / --server-port to a free port"
    )


def check(
    levers: LeverSet,
    *,
    managed: Sequence[GpuInfo],
    samples: Sequence[GpuSample] | None,
    member_pids: set[int],
    pids_are_local: bool,
    host: HostFacts,
    freed_on_stop_bytes: int,
    server_host: str,
    server_port: int,
    port_is_ours: bool,
    device_pool: DevicePool | None = None,
    server_cwd: str | None = None,
) -> list[LeverProblem]:
    """Every reason ``levers`` cannot start on this host; empty when it can.

    ``freed_on_stop_bytes`` is the pinned host memory the running server gives back when
    it stops (its own hierarchical cache), counted as available for the new one.
    ``device_pool``: one rank's device KV pool for ``levers`` (from the planner's numbers),
    which an explicit ``hicache_ratio`` multiplies as SGLang does; without it such a host
    pool is not refused (SGLang itself checks it at start), only warned about.
    """
    lv = levers.levers
    problems: list[LeverProblem] = []
    shape = Layout.of(lv)
    problems.extend(LeverProblem(lever, msg) for lever, msg in shape.problems())
    if shape.gpus_needed > len(managed):
        problems.append(
            LeverProblem(
                "tp_size",
                f"{shape.describe()} needs {shape.gpus_needed} GPUs, but this supervisor "
                f"manages {len(managed)} ({', '.join(str(g.index) for g in managed)}); lower "
                "tp_size/pp_size/dp_size (or base_gpu_id/gpu_id_step) or add GPUs to "
                "server.gpus",
            )
        )
    if samples is not None and pids_are_local:
        problems.extend(
            LeverProblem(
                "gpus",
                f"{holder}, which is not part of the server this supervisor manages; "
                f"{FOREIGN_ADVICE}",
            )
            for holder in foreign_holders(samples, member_pids)
        )
    gpu_total = min((g.memory_total_bytes for g in managed), default=0)
    available = host.available_ram_bytes + freed_on_stop_bytes
    budget = available - SGLANG_HOST_RAM_MARGIN
    if auto_sized(lv) and budget <= 0:
        # SGLang sizes the host pool to 0.8 of what is left after its margin; nothing left
        # is its only refusal (mem_cache/hicache_auto_size.py:108-112).
        problems.append(
            LeverProblem(
                "enable_hierarchical_cache",
                f"the hierarchical cache is auto-sized to a share of the available host RAM, "
                f"but only {available / GB:.1f} GB is available ({host.ram_source}) — not "
                f"more than SGLang's {SGLANG_HOST_RAM_MARGIN / GiB:.0f} GiB reserve; free host "
                "RAM or set hicache_size explicitly",
            )
        )
    by_ratio = ratio_host_bytes_per_rank(lv, device_pool)
    per_rank = host_pool_bytes_per_rank(lv, gpu_total, available) if by_ratio == 0 else by_ratio
    if per_rank is None:
        # pool_host/base.py:215-229 sizes it from the device pool after the weights; with
        # the model unknown here, never refuse what SGLang may well start.
        log.warning(
            "hicache_ratio=%s: the device KV pool of %s is unknown on this host (no "
            "config.json), so its pinned host pool is not checked before the stop; SGLang "
            "refuses it at start if it does not fit",
            lv.get("hicache_ratio"),
            lv.get("model_path"),
        )
    elif per_rank and not auto_sized(lv):
        total = ranks(lv) * per_rank
        if total > budget:
            lever = "hicache_size" if _int(lv, "hicache_size", 0) > 0 else "hicache_ratio"
            of = (
                f" ({lv.get('hicache_ratio')} × the device pool of {describe(device_pool)})"
                if by_ratio and device_pool is not None
                else ""
            )
            problems.append(
                LeverProblem(
                    lever,
                    f"the hierarchical cache needs {per_rank / GB:.1f} GB per rank{of} × "
                    f"{shape.ranks} ranks = {total / GB:.1f} GB of pinned host RAM, but only "
                    f"{available / GB:.1f} GB is available ({host.ram_source}, counting what the "
                    f"running server frees) minus SGLang's {SGLANG_HOST_RAM_MARGIN / GiB:.0f} GiB "
                    f"margin = {max(0, budget) / GB:.1f} GB; lower {lever}",
                )
            )
    if not port_is_ours:
        msg = port_problem(server_host, server_port)
        if msg is not None:
            problems.append(LeverProblem("port", msg))
    model = lv.get("model_path")
    if isinstance(model, str) and model.startswith(("/", "./", "../", "~")):
        # As the server will read it: relative to its working directory.
        path = Path(server_cwd or ".") / Path(model).expanduser()
        if not path.exists():
            problems.append(
                LeverProblem(
                    "model_path",
                    f"model path {model} does not exist on this host; fix model_path",
                )
            )
    return problems
