"""Response models of the control API, for its OpenAPI document (and so for generated
clients): the status, an operation, the levers, and one error shape for every 4xx/5xx.

The supervisor builds these answers as JSON itself; the models describe them. Each allows
extra fields (``extra="allow"``): a field the supervisor adds later reaches clients
before this file names it.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


# ------------------------------------------------------------------ errors


class LeverProblem(_Open):
    """One refused lever (or request field) and why."""

    lever: str = Field(description="SGLang dest name, env.NAME, or the request field")
    message: str


class ErrorDetail(_Open):
    message: str = Field(description="what happened and what to do")
    problems: list[LeverProblem] | None = Field(
        None, description="422: every refused lever or request field"
    )
    operation: str | dict[str, Any] | None = Field(
        None,
        description="409: the id of the running operation (a cancel of an ended one: that "
        "operation)",
    )


class Problem(BaseModel):
    """Every error answer: ``{"detail": {"message": ..., ...}}``."""

    detail: ErrorDetail


# ------------------------------------------------------------------ operations


class PhaseModel(_Open):
    name: str = Field(description="validate, preflight, drain, stop, release, start, ...")
    state: str = Field(description="running, succeeded, failed, skipped")
    started_at: str
    ended_at: str | None = None
    duration_s: float | None = None
    detail: str = ""


class NotRunModel(BaseModel):
    check: str = Field(description="what did not run (a check of SGLang's, start-up only...)")
    reason: str = Field(description="why: what this host lacks (the model config, a GPU...)")


class EffectWindowModel(_Open):
    """One window's figures: means of the daemon's load samples in it (null: no reading)."""

    samples: int = Field(description="telemetry reads with a throughput in the window")
    generation_throughput_tps: float | None = None
    running_requests: float | None = None
    queued_requests: float | None = None
    token_usage: float | None = None
    ttft_s: float | None = Field(None, description="mean time to first token")
    itl_s: float | None = Field(None, description="mean inter-token latency")
    arrival_rate_rps: float | None = Field(None, description="the offered load")


class EffectModel(_Open):
    """The measured effect of an apply (docs/api.md#the-measured-effect-of-an-apply)."""

    window_s: float
    verdict: str = Field(
        description="measuring, better, worse, mixed, unchanged, load changed, no load, "
        "not measured, interrupted"
    )
    detail: str = Field(description="the figures behind the verdict, or why there is none")
    guard: bool = Field(description="the effect guard judged it (the commit waited for it)")
    before: EffectWindowModel
    after: EffectWindowModel | None = Field(None, description="null while measuring")


class OperationModel(_Open):
    id: str
    kind: str = Field(description="apply, stop, start, restart, recover, shutdown")
    state: str = Field(description="running, succeeded, rolled_back, failed")
    dry_run: bool = False
    created_at: str
    ended_at: str | None = None
    duration_s: float | None = None
    phases: list[PhaseModel] = Field(default_factory=list)
    error: str | None = None
    rollback_reason: str | None = None
    log_tail: list[str] = Field(default_factory=list)
    levers_requested: dict[str, Any] | None = None
    levers_effective: dict[str, Any] | None = None
    levers_before: dict[str, Any] | None = Field(
        None,
        description="an apply: the levers serving when it was asked for "
        "(its diff: this -> levers_requested)",
    )
    resolved: dict[str, Any] | None = Field(
        None, description="what SGLang's resolution pipeline made of the levers (validate)"
    )
    not_cancellable: str | None = Field(
        None,
        description="why a cancel is refused now (a rollback or containment has begun); "
        "null: a running operation may be cancelled",
    )
    not_run: list[NotRunModel] = Field(
        default_factory=list,
        description="checks of the validate phase that did not run here, each with why",
    )
    path: str | None = Field(
        None,
        description="an apply's way to the server: live (levers SGLang changes on the "
        "running server), weights (new weights loaded into it) or restart; null for other "
        "operations and a change of nothing",
    )
    path_reason: str | None = Field(None, description="why that path")
    expected_downtime: dict[str, Any] | None = Field(
        None,
        description="an apply's expected time without service, stated before the stop: "
        "seconds (stop -> the new server's ready), complete, until_commit_s, behind_router, "
        "summary and parts (drain, stop, unpin, release, pin, load, probation: seconds, "
        "basis, without_service); null: nothing is restarted",
    )
    downtime: dict[str, Any] | None = Field(
        None,
        description="the time without service it caused, measured: seconds, serving_again "
        "and intervals (from a stop phase to the start phase that ended ready); null: it "
        "stopped nothing",
    )
    effect: EffectModel | None = Field(
        None,
        description="an apply that committed (or, with the effect guard, is being judged): "
        "its measured effect; null before, and for other operations",
    )


class OperationEnvelope(BaseModel):
    """``POST /levers``, ``/stop``, ``/start``, ``/restart`` and ``GET /operations/{id}``."""

    operation: OperationModel


class OperationList(BaseModel):
    operations: list[OperationModel] = Field(description="newest first")


# ------------------------------------------------------------------ levers and status


class LeverSetModel(_Open):
    levers: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, Any] = Field(default_factory=dict)


class LeversAnswer(_Open):
    levers: dict[str, Any] = Field(description="SGLang dest name -> value (secrets redacted)")
    env: dict[str, Any]
    last_good: LeverSetModel | None


class GpuProcess(_Open):
    pid: int
    used_bytes: int | None = None
    member: bool = Field(description="one of the server's processes (else foreign)")


class GpuStatus(_Open):
    index: int
    uuid: str | None = None
    name: str | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    baseline_bytes: int | None = None
    processes: list[GpuProcess] = Field(default_factory=list)
    error: str | None = Field(None, description="the GPU query failed")
    node: str | None = Field(
        None, description='the Slurm node it is on (server.launcher = "slurm" only)'
    )
    sample_age_s: float | None = Field(
        None, description="how old its node's last sample is (slurm: /status never waits)"
    )


class NodeStatus(_Open):
    name: str
    gpus: list[int]
    memory_used_bytes: int
    memory_total_bytes: int
    sample_age_s: float | None = None


class ServerModel(_Open):
    pid: int
    url: str
    started_at: str | None = None
    ready_at: str | None = None
    max_total_num_tokens: int | None = None
    launch_tag: str | None = None
    log_path: str | None = None
    start_s: float | None = Field(
        None,
        description="spawn -> ready of this launch, measured by this daemon (null: adopted): "
        "the load an apply's expected time without service starts from",
    )


class ThroughputModel(_Open):
    gen_tokens_per_s: float | None = None
    running_requests: float | None = None
    queued_requests: float | None = None
    token_usage: float | None = None
    cache_hit_rate: float | None = None
    used_tokens: float | None = Field(None, description="KV tokens in use over all DP workers")
    generation_tokens_total: float | None = None
    prompt_tokens_total: float | None = None
    ttft_seconds_sum: float | None = Field(
        None, description="SGLang's time-to-first-token histogram: its sum (seconds)"
    )
    ttft_count: float | None = Field(None, description="... and its count")
    source: str | None = Field(None, description="metrics, log, or null")


class DiagnosisModel(_Open):
    kind: str = Field(description="kv_bound, queue_bound, not_saturated or no_metrics")
    since: float = Field(description="unix time the reported kind began")
    evidence: dict[str, Any] = Field(
        description="the gauges, the thresholds, held_s / hold_s, and pending: a kind seen "
        "but not held long enough yet"
    )
    message: str
    proposal: str | None = Field(description="what to do (null: nothing)")
    prefix_cache: dict[str, Any] | None = Field(
        None,
        description="the prefix cache over the recent window, from the server's own "
        "counters (supervisor/planner/prefixcache.py): hit_rate, evicted_tokens_per_s, "
        "evicted_per_prompt_token, device_retention_s, ...; null: not enough of it yet",
    )


class HistoryAnswer(BaseModel):
    interval_s: float = Field(description="seconds between samples (the telemetry's)")
    max_samples: int = Field(description="the most samples kept (an hour's)")
    columns: list[str]
    t: list[float] = Field(description="unix time of each sample, oldest first")
    running_requests: list[float | None]
    queued_requests: list[float | None]
    ttft_s: list[float | None] = Field(description="mean time to first token in the interval")
    cache_hit_rate: list[float | None]
    gen_tokens_per_s: list[float | None]
    token_usage: list[float | None]
    itl_s: list[float | None] = Field(description="mean inter-token latency in the interval")
    arrivals_per_s: list[float | None] = Field(
        description="requests that arrived per second in the interval (the offered load)"
    )


class DriftModel(BaseModel):
    lever: str = Field(description="a lever's dest name, or env.NAME")
    config: Any = Field(description="the config's value; null: not in the config")
    serving: Any = Field(description="the serving value; null: not set")


class StatusAnswer(_Open):
    version: str = Field(description="the daemon's version")
    state: str = Field(
        description="one of docs/states.md: loading (the daemon's start-up has not yet found "
        "out what runs), stopped, starting, ready, draining, stopping, releasing, backoff, "
        "failed"
    )
    state_reason: str
    state_for_s: float
    backend: str = Field(description="sglang or simulated")
    server: ServerModel | None
    levers: dict[str, Any]
    env: dict[str, Any]
    last_good_levers: LeverSetModel | None
    gpus: list[GpuStatus]
    nodes: list[NodeStatus] | None = Field(
        None, description='server.launcher = "slurm": each node with its GPUs (indices)'
    )
    slurm: dict[str, Any] | None = Field(
        None,
        description='server.launcher = "slurm": job_id, nodes, presence (the per-node '
        "presence step: state, sample_age_s per node, launches, refusals), server_steps "
        "(made, refused), stuck, allocation_unusable (docs/slurm.md)",
    )
    operation: OperationModel | None
    last_operation: dict[str, Any] | None
    restarts: int
    restarts_by_reason: dict[str, int]
    throughput: ThroughputModel
    diagnosis: DiagnosisModel | None = Field(
        None, description="where the load's bottleneck is (supervisor/planner/diagnosis.py)"
    )
    loading: str | None = Field(
        None,
        description="what the daemon's start-up is still loading (state, SGLang's flag schema, "
        "GPUs); null once done. Meanwhile mutating calls answer 503 with Retry-After",
    )
    sglang: dict[str, Any] | None = Field(
        None,
        description="which SGLang answers validation: version, path, validation "
        "(full | degraded | checking), reason (why degraded, or which parts are another "
        "version's knowledge), missing (entry points it lacks), knowledge_from (the SGLang "
        "version of the planner's formulas and range tables)",
    )
    warnings: list[str]
    drift: list[DriftModel] | None = Field(
        None,
        description="the levers (env vars as env.NAME) where the config's [server.levers] / "
        "[server.env] and the serving set differ, compared by SGLang's canonical names "
        "(--tp is tp_size); [] when none. `sglang-supervisor reconcile` applies the config's",
    )
    levers_config: dict[str, Any] | None = Field(
        None,
        description="the config's levers as the desired state: levers_source (api | "
        "config), read_at (daemon start, SIGHUP, POST /reconcile), serving (what the drift "
        "compares with: the running server's levers, or with none running the set the next "
        "start launches), problems (config levers the schema refuses), last_reconcile",
    )
    effect: dict[str, Any] | None = Field(
        None,
        description="the last apply's measured effect, with its operation id (as the "
        "operation's effect); null before the first",
    )
    probation: dict[str, Any] | None = Field(
        None,
        description="while a new server of an apply is on probation: until (ISO time), "
        "probes_ok, pid; null otherwise (/readyz answers 503 meanwhile)",
    )
    sglang_cache: dict[str, Any] | None = Field(
        None,
        description="the server's SGLANG_CACHE_DIR (what launches compile and the next "
        "reuses): path, bytes and files as last measured (once a minute, off the event "
        "loop; null before the first), complete (false: the walk stopped early, a lower "
        "bound), measured_at, error",
    )


class Health(BaseModel):
    ok: bool
    state: str
    version: str
    loading: str | None = Field(None, description="what start-up is still loading; null: done")


class Readiness(BaseModel):
    ready: bool
    state: str
    reason: str


# ------------------------------------------------------------------ media types


class PrometheusResponse(Response):
    media_type = CONTENT_TYPE_LATEST


class EventStreamResponse(StreamingResponse):
    media_type = "text/event-stream"


def problem(description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    """An OpenAPI ``responses`` entry with the error shape."""
    out: dict[str, Any] = {"model": Problem, "description": description}
    if headers:
        out["headers"] = headers
    return out


RETRY_AFTER_S = 5
BUSY = problem(
    "another operation is running (its id in detail.operation); nothing was changed",
    {
        "Retry-After": {
            "description": "seconds to wait before trying again",
            "schema": {"type": "integer"},
        }
    },
)
INVALID = problem("the request or a lever was refused; nothing was changed")
NOT_FOUND = problem("no such thing")
UNAUTHORIZED = problem("a bearer token is required (Authorization: Bearer <token>)")
TOO_LARGE = problem("the request body is over [api] max_request_bytes")
