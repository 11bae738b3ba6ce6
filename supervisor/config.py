"""The daemon's settings: a TOML file, then the environment, then command-line options.

Sections: ``[api]``, ``[server]`` (+ ``[server.levers]``, ``[server.env]``),
``[timeouts]``, ``[router]``, ``[sim]``, ``[slurm]``. Every option, with its meaning, is in
``deploy/config.example.toml``.

The file: ``--config``, else ``$SGLANG_SUPERVISOR_CONFIG``, else
``/etc/sglang-supervisor/config.toml`` when it exists, else none (defaults).
The environment (for containers): ``SGLANG_SUPERVISOR_<SECTION>__<KEY>`` overrides one
option of the file, e.g. ``SGLANG_SUPERVISOR_API__PORT=8471``,
``SGLANG_SUPERVISOR_TIMEOUTS__READY_TIMEOUT_S=3600``,
``SGLANG_SUPERVISOR_SERVER__GPUS='["0","1"]'`` (JSON for lists and tables), and
``SGLANG_SUPERVISOR_STATE_DIR`` / ``_SIMULATE`` / ``_KEEP_SERVER_ON_EXIT`` / ``_LOG_LEVEL``
at the top level, ``SGLANG_SUPERVISOR_ROUTER__URL`` for ``[router]``. ``instance`` is
not read from the environment: ``SGLANG_SUPERVISOR_INSTANCE`` is
the launch tag every server process carries. Command-line options win over both.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sglang_supervisor.files import read_regular
from sglang_supervisor.slurm.settings import Launcher, SlurmSettings

#: Initial levers of ``serve --simulate`` with no config: an 8-GPU tensor-parallel server.
SIMULATED_DEFAULT_LEVERS: dict[str, Any] = {
    "model_path": "meta-llama/Llama-3.1-70B-Instruct",
    "tp_size": 8,
    "mem_fraction_static": 0.85,
}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ApiSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8470, ge=0, le=65535)
    #: File holding the bearer token (mode 600); $SGLANG_SUPERVISOR_TOKEN takes precedence.
    token_file: str | None = None
    #: File holding a second bearer token that can only read (mode 600);
    #: $SGLANG_SUPERVISOR_READ_TOKEN takes precedence. For Prometheus and dashboards.
    read_token_file: str | None = None
    #: Serve /metrics without the token (for a Prometheus that cannot send one).
    metrics_public: bool = False
    #: Serve the API over TLS (uvicorn's own): the certificate chain (PEM) and its key.
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    #: Larger request bodies are refused with 413.
    max_request_bytes: int = Field(1 << 20, ge=1024)
    #: A request body not all there this long after the request began: 408 (its memory
    #: goes with its connection).
    body_timeout_s: float = Field(10.0, gt=0, le=3600, allow_inf_nan=False)
    #: Open connections (event streams included) the API keeps; a request beyond is 503.
    max_connections: int = Field(64, ge=4, le=100_000)
    #: Host header names (``name`` or ``name:port``) the API answers besides loopback, the
    #: bound address and this host's name: e.g. the name a reverse proxy forwards. ``"*"``
    #: turns the check off (then only the token keeps DNS-rebound pages out).
    allowed_hosts: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _tls_pair(self) -> ApiSettings:
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            given, other = (
                ("ssl_certfile", "ssl_keyfile")
                if self.ssl_keyfile is None
                else ("ssl_keyfile", "ssl_certfile")
            )
            raise ValueError(
                f"[api] {given} is set but {other} is not: TLS needs both the certificate "
                "and its private key (PEM files); set both, or neither for plain HTTP"
            )
        return self


class ServerSettings(_Section):
    #: The interpreter that has SGLang; the server runs as ``<python> -m sglang.launch_server``.
    python: str = sys.executable
    #: Where the server listens (the supervisor owns --host/--port).
    host: str = "127.0.0.1"
    port: int = Field(30000, ge=1, le=65535)
    #: Managed GPUs, by NVML index or UUID. Empty in real mode means "all GPUs NVML sees".
    gpus: list[str] = Field(default_factory=list)
    #: The levers the config asks for: the initial levers (used when the state dir holds
    #: none yet), and the desired state that /status's ``drift`` compares with the serving
    #: set and ``reconcile`` applies. SIGHUP re-reads them.
    levers: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    #: Who owns the levers. "api" (default): changes through the API stay until the next
    #: change; a SIGHUP only refreshes ``drift``. "config": the config file does — a
    #: SIGHUP (systemd ExecReload) reconciles the server to ``[server.levers]`` and
    #: ``[server.env]``, and at daemon start they win over the last applied set (docs/systemd.md).
    levers_source: Literal["api", "config"] = "api"
    #: Working directory of the server process.
    cwd: str | None = None
    #: How the server is launched: "local" (a process tree on this host) or "slurm" (one
    #: job step across the nodes of the Slurm allocation the daemon runs in; ``[slurm]``).
    launcher: Launcher = "local"
    #: Log files of this many launches are kept in <state_dir>/logs.
    log_keep_launches: int = Field(10, ge=1)
    #: A launch's log larger than this is copied to <name>.1 and truncated.
    log_max_mib: int = Field(64, ge=1)
    #: Also forward every line of the server's log into the daemon's own log (the
    #: journal under systemd), as logger ``sglang``: bounded, redacted (observe/logforward).
    log_to_journal: bool = False
    #: The server's SGLANG_CACHE_DIR (its compiled kernels: Triton, TorchInductor, CUDA,
    #: TileLang, FlashInfer, DeepGEMM), kept across restarts; unless the environment sets
    #: one. Default ``<state_dir>/sglang-cache``.
    sglang_cache_dir: str | None = None
    #: The effect guard: an apply's commit waits for its measured effect (``[timeouts]
    #: effect_window_s``) and rolls back to the last-good levers when it is worse than
    #: before under comparable load. A request's ``effect_guard`` overrides it.
    effect_guard: bool = False
    #: How much a figure must move (relative) to count as better or worse.
    effect_margin: float = Field(0.10, gt=0, lt=1)
    #: How far the arrival rate may move (relative) for the windows to be comparable;
    #: beyond it the verdict is "load changed".
    effect_load_margin: float = Field(0.20, gt=0, lt=1)


class TimeoutSettings(_Section):
    #: SIGTERM -> SIGKILL grace; also the bound on SGLang's own drain at shutdown.
    stop_grace_s: float = Field(30.0, ge=0)
    #: After SIGKILL, how long members may take to vanish before teardown gives up.
    kill_timeout_s: float = Field(30.0, gt=0)
    #: Base deadline for every managed GPU to be verified released after the members exit.
    release_timeout_s: float = Field(60.0, gt=0)
    #: Extra release time per GiB of pinned host memory (hicache): ~0.2 s/GiB measured on H200.
    release_s_per_pinned_gib: float = Field(0.25, ge=0)
    #: The service's budget for a whole stop: the unit's TimeoutStopSec (360). The plan
    #: keeps the teardown deadline of its proposal (stop_grace_s + kill_timeout_s +
    #: release_timeout_s + release_s_per_pinned_gib x pinned GiB) within it.
    stop_budget_s: float = Field(360.0, gt=0)
    #: Memory above baseline still counted as released (driver noise, other tenants' jitter).
    release_tolerance_mib: int = Field(512, ge=0)
    #: Consecutive clean samples needed before a GPU counts as released.
    release_samples: int = Field(3, ge=1)
    #: Time between release samples (an NVML sample of a GPU takes ~20 us).
    release_interval_s: float = Field(0.01, gt=0, le=5)
    #: Time between /health_generate probes while a server starts.
    readiness_poll_s: float = Field(0.05, gt=0, le=10)
    #: How long a start may take to answer /health_generate (model loads take minutes).
    ready_timeout_s: float = Field(1800.0, gt=0)
    #: After an apply's start is ready, a crash within this window still rolls back.
    probation_s: float = Field(10.0, ge=0)
    liveness_interval_s: float = Field(10.0, gt=0)
    liveness_timeout_s: float = Field(30.0, gt=0)
    #: Consecutive failed /health_generate probes that mean "hung".
    liveness_failures: int = Field(3, ge=1)
    backoff_initial_s: float = Field(2.0, ge=0)
    backoff_max_s: float = Field(120.0, ge=0)
    #: N crashes within the window -> failed.
    crash_loop_count: int = Field(5, ge=1)
    crash_loop_window_s: float = Field(600.0, gt=0)
    #: Upper bound on an optional drain (POST /levers drain_timeout_s).
    max_drain_s: float = Field(3600.0, ge=0)
    #: Before an apply stops the server (or loads new weights into it), its new weight
    #: files are read into the page cache for at most this long (engine/warmup.py); 0
    #: turns the warm-up off. A SIGHUP reloads it, as every timeout.
    warmup_timeout_s: float = Field(600.0, ge=0)
    #: After an apply commits, how long its effect is measured: the server over this
    #: window beside the same window before the apply (the load history keeps an hour).
    #: With the effect guard the commit waits for it. 0: not measured.
    effect_window_s: float = Field(60.0, ge=0, le=1800)
    #: How long a kind of load must hold before /status's ``diagnosis`` reports it (the
    #: SglangKvCacheExhausted alert's ``for: 3m``; supervisor/planner/diagnosis.py).
    diagnosis_hold_s: float = Field(180.0, ge=0)


class RouterSettings(_Section):
    """An sglang-router (model gateway) in front of this server: the ``[router]`` table."""

    #: The router's base URL ("http://router:30000"). Unset: no router integration.
    url: str | None = None
    #: How the router reaches this server; default ``http://<server host>:<server port>``
    #: (127.0.0.1 when the server listens on 0.0.0.0 or ::).
    worker_url: str | None = None
    #: File holding the router's API key (its --api-key), sent as a bearer token;
    #: $SGLANG_SUPERVISOR_ROUTER_API_KEY takes precedence.
    api_key_file: str | None = None
    #: Timeout of one call to the router.
    request_timeout_s: float = Field(5.0, gt=0)
    #: How long an added worker may take to be listed healthy by the router.
    healthy_timeout_s: float = Field(60.0, gt=0)
    #: After the worker is removed from the router, wait at most this long for its
    #: running + queued requests to reach 0 before stopping the server.
    drain_timeout_s: float = Field(300.0, ge=0)
    #: Time between looks at the server's running + queued requests while draining.
    drain_poll_s: float = Field(0.5, gt=0, le=10)


class SimulateSettings(_Section):
    gpus: int = Field(8, ge=1, le=64)
    gpu_memory_mib: int = Field(143771, gt=0)
    #: Memory each simulated GPU shows used with nothing of ours on it.
    baseline_mib: int = Field(0, ge=0)
    host_ram_gib: int = Field(2048, gt=0)
    #: Simulated model-load time; None keeps the simulated server's default.
    startup_s: float | None = Field(None, ge=0)
    #: How long the simulated /health_generate takes (SGLang runs a one-token generation;
    #: the simulator's default 1 s); None keeps that default.
    health_s: float | None = Field(None, ge=0)
    #: Seconds per GiB of hierarchical-cache host pool the simulated server takes to pin at
    #: start and to unpin at stop; None: the figures measured on an H200 host (0.58 and
    #: 0.2, supervisor/planner/stopcost.py). The plan's expected downtime uses the same.
    pin_s_per_gib: float | None = Field(None, ge=0)
    unpin_s_per_gib: float | None = Field(None, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _retired_oom_fraction(cls, data: Any) -> Any:
        """``oom_fraction`` (a fixed failure threshold) is retired: the simulated server
        now runs out of memory where SGLang does. An old config still loads."""
        if isinstance(data, dict) and "oom_fraction" in data:
            data = {k: v for k, v in data.items() if k != "oom_fraction"}
            logging.getLogger(__name__).warning(
                "[sim] oom_fraction is ignored: the simulated server fails where SGLang "
                "would (CUDA-graph capture, or a prefill's activations); remove the key"
            )
        return data


class Settings(_Section):
    simulate: bool = False
    state_dir: Path = Field(default_factory=lambda: default_state_dir())
    #: Names this daemon's launches (the launch tag is ``<instance>.<launch id>``). None:
    #: derived from the state directory, so two daemons never claim each other's servers.
    instance: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    #: Leave the server running when the daemon exits, for the next daemon to adopt (no
    #: model reload on a daemon upgrade). Pair with systemd KillMode=process and the
    #: cleanup ExecStopPost; $SGLANG_SUPERVISOR_KEEP_SERVER=1 sets it too.
    keep_server_on_exit: bool = False
    #: The daemon's log level (``--log-level`` wins); SIGHUP re-reads it.
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    api: ApiSettings = Field(default_factory=ApiSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    timeouts: TimeoutSettings = Field(default_factory=TimeoutSettings)
    router: RouterSettings = Field(default_factory=RouterSettings)
    #: The simulated backend (``--simulate``), the ``[sim]`` table.
    sim: SimulateSettings = Field(default_factory=SimulateSettings)
    #: The slurm launcher (``server.launcher = "slurm"``), the ``[slurm]`` table.
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)

    @model_validator(mode="after")
    def _simulated_defaults(self) -> Settings:
        if self.simulate and not self.server.levers:
            self.server.levers = dict(SIMULATED_DEFAULT_LEVERS)
        return self


def instance_name(settings: Settings) -> str:
    """The configured instance, or one derived from the state directory's real path."""
    if settings.instance:
        return settings.instance
    digest = hashlib.sha256(os.path.realpath(settings.state_dir).encode()).hexdigest()[:10]
    return f"sglang-supervisor-{digest}"


def instance_tag_prefix(settings: Settings) -> str:
    """What every launch tag of this instance starts with (``<instance>.<launch id>``):
    the daemon's sweeps and the supervisor's membership all match on it."""
    return f"{instance_name(settings)}."


def default_state_dir() -> Path:
    """systemd's $STATE_DIRECTORY, else the XDG state home."""
    if env := os.environ.get("STATE_DIRECTORY"):
        return Path(env.split(":")[0])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "sglang-supervisor"


ENV_PREFIX = "SGLANG_SUPERVISOR_"
CONFIG_ENV = "SGLANG_SUPERVISOR_CONFIG"
SYSTEM_CONFIG = Path("/etc/sglang-supervisor/config.toml")


def default_config_path() -> Path | None:
    """``$SGLANG_SUPERVISOR_CONFIG``, else the system config when it exists, else None."""
    if env := os.environ.get(CONFIG_ENV):
        return Path(env)
    return SYSTEM_CONFIG if SYSTEM_CONFIG.is_file() else None


class _FromEnvironment(BaseSettings):
    """The options set in the environment (pydantic-settings reads and validates them)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="ignore"
    )

    simulate: bool | None = None
    state_dir: Path | None = None
    keep_server_on_exit: bool | None = None
    log_level: Literal["debug", "info", "warning", "error"] | None = None
    api: ApiSettings | None = None
    server: ServerSettings | None = None
    timeouts: TimeoutSettings | None = None
    router: RouterSettings | None = None
    sim: SimulateSettings | None = None
    slurm: SlurmSettings | None = None


def settings_from_environment() -> dict[str, Any]:
    """``{section: {key: value}}`` of the ``SGLANG_SUPERVISOR_*`` options that are set.

    Raises ``ValueError`` naming the variable on a bad value.
    """
    try:
        env = _FromEnvironment()
    except ValidationError as exc:
        bad = "; ".join(
            f"{ENV_PREFIX}{'__'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
            for e in exc.errors()
        )
        raise ValueError(f"invalid setting in the environment: {bad}") from exc
    return env.model_dump(exclude_unset=True, exclude_none=True)


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def load_settings(path: Path | None, overrides: dict[str, Any]) -> Settings:
    """Read ``path`` (TOML; None: :func:`default_config_path`), then the environment's
    ``SGLANG_SUPERVISOR_<SECTION>__<KEY>`` options, then ``overrides`` (dotted keys).

    Raises ``ValueError`` with the file name and the offending key on a bad file.
    """
    if path is None:
        path = default_config_path()
    data: dict[str, Any] = {}
    if path is not None:
        try:
            # A FIFO, a device or a hung mount is refused, never waited on (files.py).
            data = tomllib.loads(read_regular(path, "config").text())
        except OSError as exc:
            raise ValueError(f"cannot read config {path}: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:
            raise ValueError(f"config {path} is not UTF-8 text: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"config {path} is not valid TOML: {exc}") from exc
    _merge(data, settings_from_environment())
    for dotted, value in overrides.items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        # Each bad key and why, never its value: pydantic's text quotes every value
        # (input_value='sk-...'), and this message reaches POST /reconcile's answer, the
        # audit log and the journal; a secret under a misspelt section would be in them.
        bad = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
            for e in exc.errors(include_url=False, include_input=False)
        )
        where = f"config {path}" if path is not None else "the settings"
        raise ValueError(f"{where} is refused: {bad}; fix or remove what is named") from None
