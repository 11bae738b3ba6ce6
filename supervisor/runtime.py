"""Assembling a Supervisor from settings: the backend (real or simulated) and the OS side."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sglang_supervisor.config import Settings, instance_tag_prefix
from sglang_supervisor.engine import Supervisor
from sglang_supervisor.host import ports, process
from sglang_supervisor.host.backend import Backend, ProcessOps, ServerHandle
from sglang_supervisor.host.teardown import TeardownReport
from sglang_supervisor.host.teardown import teardown as stop_tree
from sglang_supervisor.observe.health import HttpHealthChecker
from sglang_supervisor.sglang.parser import load_schema
from sglang_supervisor.sglang.router import build_link
from sglang_supervisor.sglang.schema import load_bundled
from sglang_supervisor.store import Store
from sglang_supervisor.units import GiB


class OsProcessOps:
    """``ProcessOps`` on real processes (``sglang_supervisor.host.process``)."""

    def __init__(self, cwd: Path | None = None) -> None:
        self.cwd = cwd

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], *, tag: str, log_path: Path
    ) -> ServerHandle:
        return process.spawn(argv, env, tag=tag, log_path=log_path, cwd=self.cwd)

    def teardown(
        self,
        handle: ServerHandle | None,
        *,
        tag: str | None,
        tag_prefix: str | None,
        grace_s: float,
        kill_timeout_s: float,
        exclude_tag: str | None = None,
        cut_grace: Callable[[], bool] | None = None,
    ) -> TeardownReport:
        launch = handle if isinstance(handle, process.Launch) else None
        return stop_tree(
            launch,
            tag=tag,
            tag_prefix=tag_prefix,
            exclude_tag=exclude_tag,
            grace_s=grace_s,
            kill_timeout_s=kill_timeout_s,
            cut_grace=cut_grace,
        )

    def adopt(self, pid: int, create_time: float, tag: str, log_path: Path) -> ServerHandle | None:
        return process.adopt(pid, create_time, tag, log_path)

    def members(
        self,
        handle: ServerHandle | None,
        *,
        tag: str | None,
        tag_prefix: str | None,
        exclude_tag: str | None = None,
    ) -> set[int]:
        launch = handle if isinstance(handle, process.Launch) else None
        found = process.find_members(
            launch, tag=tag, tag_prefix=tag_prefix, exclude_tag=exclude_tag
        )
        return set(found)

    def port_listeners(self, host: str, port: int) -> list[int | None]:
        return ports.port_listeners(host, port)


def build_backend(settings: Settings) -> Backend:
    """The simulated backend under ``--simulate``, else SGLang on NVML-probed GPUs."""
    if settings.simulate:
        from sglang_supervisor.sim.capacity import resolve_avg_tokens, resolve_model
        from sglang_supervisor.sim.flags import sim_pin_rates
        from sglang_supervisor.sim.gpus import SimGpuProbe, prepare_registry

        sim = settings.sim
        registry = settings.state_dir / "sim-gpus"
        prepare_registry(registry)
        env = {
            "SGLANG_SIM_GPU_DIR": str(registry),
            "SGLANG_SIM_GPU_MEMORY_MIB": str(sim.gpu_memory_mib),
            "SGLANG_SIM_HOST_RAM_GIB": str(sim.host_ram_gib),
        }
        if sim.startup_s is not None:
            env["SGLANG_SIM_STARTUP_S"] = str(sim.startup_s)
        if sim.health_s is not None:
            env["SGLANG_SIM_HEALTH_S"] = str(sim.health_s)
        rates = sim_pin_rates(sim.pin_s_per_gib, sim.unpin_s_per_gib)
        env["SGLANG_SIM_PIN_S_PER_GIB"] = str(rates.pin_s_per_gib)
        env["SGLANG_SIM_UNPIN_S_PER_GIB"] = str(rates.unpin_s_per_gib)
        probe = SimGpuProbe(
            registry,
            count=sim.gpus,
            memory_total_mib=sim.gpu_memory_mib,
            baseline_mib=sim.baseline_mib,
        )
        return Backend(
            name="simulated",
            command=[sys.executable, "-m", "sglang_supervisor.sim.server"],
            probe=probe,
            env=env,
            simulated_host_ram_bytes=sim.host_ram_gib * GiB,
            plan_model=resolve_model,
            plan_avg_tokens=resolve_avg_tokens,
            pin_rates=rates,
        )
    from sglang_supervisor.host.nvml import NvmlProbe

    return Backend(
        name="sglang",
        command=[settings.server.python, "-m", "sglang.launch_server"],
        probe=NvmlProbe(),
    )


def build_supervisor(settings: Settings) -> Supervisor:
    """A Supervisor wired to real processes (or a Slurm job step), real HTTP probes and
    the state directory."""
    store = Store(settings.state_dir)
    cwd = Path(settings.server.cwd) if settings.server.cwd else None
    backend = build_backend(settings)
    procs: ProcessOps = OsProcessOps(cwd)
    if settings.server.launcher == "slurm":
        from sglang_supervisor.slurm.runtime import slurm_backend

        backend, procs = slurm_backend(settings, backend, cwd)
    return Supervisor(
        settings,
        backend=backend,
        procs=procs,
        health=HttpHealthChecker(),
        schema=load_bundled(),
        schema_loader=load_schema,
        store=store,
        router=build_link(settings.router, settings.server),
    )


def cleanup(
    settings: Settings, *, forced: bool = False, cut_grace: Callable[[], bool] | None = None
) -> TeardownReport:
    """Stop every process carrying this instance's launch tag: SIGTERM, then SIGKILL
    after ``stop_grace_s`` (at once when ``forced``, or once ``cut_grace()`` is true in
    the middle of the wait). Blocking.

    The one sweep of the whole instance: ``ExecStopPost=`` runs it for the
    ``KillMode=process`` drop-in (whatever server the daemon left behind goes too), and
    the daemon at its exit, after the supervisor's own teardown (never beside it).
    """
    t = settings.timeouts
    return stop_tree(
        None,
        tag_prefix=instance_tag_prefix(settings),
        grace_s=0.0 if forced else t.stop_grace_s,
        kill_timeout_s=t.kill_timeout_s,
        cut_grace=cut_grace,
    )
