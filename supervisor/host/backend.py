"""The server-side interfaces the Supervisor is driven through.

``ProcessOps`` and ``ServerHandle`` are the OS side (real processes in production:
``sglang_supervisor.runtime.OsProcessOps``; fakes in unit tests); ``Backend`` says how servers
are started here (real SGLang or the simulated server) and which GPU probe watches them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sglang_supervisor.host.gpu import GpuProbe
from sglang_supervisor.host.teardown import TeardownReport

if TYPE_CHECKING:
    from sglang_supervisor.planner import ModelSpec
    from sglang_supervisor.planner.stopcost import PinRates


class ServerHandle(Protocol):
    """A launched (or adopted) server launcher; ``sglang_supervisor.host.process.Launch`` is one."""

    pid: int
    create_time: float
    tag: str
    log_path: Path
    returncode: int | None

    def poll(self) -> bool: ...

    def describe_exit(self) -> str: ...


class ProcessOps(Protocol):
    """The OS side: real processes in production, a fake in unit tests."""

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], *, tag: str, log_path: Path
    ) -> ServerHandle: ...

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
        """SIGTERM, ``grace_s`` (ended early once ``cut_grace()`` is true), SIGKILL."""
        ...

    def members(
        self,
        handle: ServerHandle | None,
        *,
        tag: str | None,
        tag_prefix: str | None,
        exclude_tag: str | None = None,
    ) -> set[int]: ...

    def adopt(self, pid: int, create_time: float, tag: str, log_path: Path) -> ServerHandle | None:
        """A handle on a launcher an earlier daemon started, if that very process runs."""
        ...

    def port_listeners(self, host: str, port: int) -> list[int | None]:
        """Pids listening on ``host:port`` (``None``: one this process cannot see);
        empty when the port is free. Raises ``sglang_supervisor.host.ports.PortsUnreadable``."""
        ...


@dataclass
class Backend:
    """How servers are started here: real SGLang, or the simulated one."""

    name: str  # "sglang" or "simulated"
    #: The command before the flags: ``[python, "-m", "sglang.launch_server"]``.
    command: list[str]
    probe: GpuProbe
    #: Extra environment for every launch (the simulated backend's knobs).
    env: dict[str, str] = field(default_factory=dict)
    #: The simulated host's RAM; None reads the real host's.
    simulated_host_ram_bytes: int | None = None
    #: The model this backend's server serves for a ``model_path`` and environment, for
    #: the planner (the simulated server's own resolution); None: read the model directory.
    plan_model: Callable[[str, Mapping[str, str]], ModelSpec] | None = None
    #: The average request length this backend's load implies (the simulated load), with
    #: where it came from; None when it implies none.
    plan_avg_tokens: Callable[[Mapping[str, str]], tuple[int, str] | None] | None = None
    #: What pinning and unpinning the host pool cost this backend's server (the
    #: simulated one's ``[sim]`` rates); None: the figures measured on an H200.
    pin_rates: PinRates | None = None
