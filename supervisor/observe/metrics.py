"""The daemon's own Prometheus metrics, in a private registry.

One prefix (``sglang_supervisor_``), base units, ``_total`` counters, bounded labels
(state, gpu index, kind, outcome, phase, reason — never pids or flag strings). Values the
supervisor already holds (state, counts, GPU memory, the server's throughput) are read at
scrape time by a collector; durations are histograms observed when an operation ends.
``render()`` blocks (it samples the GPUs): call it from a worker thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sglang_supervisor.host.gpu import GpuQueryError
from sglang_supervisor.observe.effect import VERDICTS
from sglang_supervisor.operations import OUTCOMES, Operation
from sglang_supervisor.phases import TIMED_PHASES, OpKind, base_phase
from sglang_supervisor.states import ServerState
from sglang_supervisor.version import python_version, version

if TYPE_CHECKING:
    from sglang_supervisor.engine import Supervisor, SupervisorView

PREFIX = "sglang_supervisor"
#: Model loads take minutes: buckets reach 30 minutes.
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800)
#: The phase label's values; a phase of a rollback or clean-up counts under its base name.
PHASES = tuple(str(p) for p in TIMED_PHASES)
OPERATION_KINDS = tuple(str(k) for k in OpKind)


def phase_label(name: str) -> str | None:
    """``rollback_start`` -> ``start``; None for a name outside the bounded set."""
    base = base_phase(name)
    return str(base) if base in TIMED_PHASES else None


def _slurm(slurm: Mapping[str, Any]) -> Iterator[Metric]:
    """The slurm launcher's (``/status`` ``slurm``): how old each node's last sample is,
    the job steps made and the ones Slurm refused, and whether this allocation can still
    host the server. Labels: the allocation's nodes, kind ``presence``/``server``."""
    presence = slurm.get("presence") or {}
    steps = slurm.get("server_steps") or {}
    age = GaugeMetricFamily(
        f"{PREFIX}_slurm_node_sample_age_seconds",
        "Age of each node's last sample (GPUs, RAM, our processes) from the per-node presence",
        labels=["node"],
    )
    for node, seconds in (presence.get("sample_age_s") or {}).items():
        age.add_metric([str(node)], float(seconds))
    yield age
    yield GaugeMetricFamily(
        f"{PREFIX}_slurm_presence_up",
        "1 while the per-node presence step runs and every node has sampled",
        value=1.0 if presence.get("state") == "up" else 0.0,
    )
    made = CounterMetricFamily(
        f"{PREFIX}_slurm_steps_made",
        "Job steps this daemon made: the per-node presence's launches, the server's steps",
        labels=["kind"],
    )
    made.add_metric(["presence"], float(presence.get("launches", 0)))
    made.add_metric(["server"], float(steps.get("made", 0)))
    yield made
    refused = CounterMetricFamily(
        f"{PREFIX}_slurm_step_refusals",
        "Job steps Slurm refused to create (the job's step limit, a controller down)",
        labels=["kind"],
    )
    refused.add_metric(["presence"], float(presence.get("refusals", 0)))
    refused.add_metric(["server"], float(steps.get("refused", 0)))
    yield refused
    yield GaugeMetricFamily(
        f"{PREFIX}_slurm_allocation_unusable",
        "1 once Slurm refuses this job's steps for good (its step limit, the job gone) or "
        "twice in a row: the daemon exits (status 4) for a fresh allocation",
        value=1.0 if slurm.get("allocation_unusable") else 0.0,
    )


class _Collector(Collector):
    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        #: The view taken on the event loop for the render in progress.
        self.view: SupervisorView | None = None

    def collect(self) -> Iterator[Metric]:
        view = self.view or self.sup.view()
        state = GaugeMetricFamily(
            f"{PREFIX}_state",
            "1 for the state the server is in, 0 for the others",
            labels=["state"],
        )
        for s in ServerState:
            state.add_metric([s.value], 1.0 if view.state == s else 0.0)
        yield state
        yield GaugeMetricFamily(
            f"{PREFIX}_state_seconds",
            "Seconds since the last state change",
            value=view.state_for_s,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_server_up",
            "1 while the server is ready (answered /health_generate)",
            value=1.0 if view.state == ServerState.READY else 0.0,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_start_refused",
            "1 while the daemon's own start is refused by a process not ours on a managed "
            "GPU (retried with back-off; /status start_refused says which)",
            value=1.0 if view.start_refused else 0.0,
        )
        restarts = CounterMetricFamily(
            f"{PREFIX}_restarts",
            "Restarts of a server that had been ready, by reason",
            labels=["reason"],
        )
        for reason in ("crash", "hung"):
            restarts.add_metric([reason], float(view.restarts_by_reason.get(reason, 0)))
        yield restarts
        ops = CounterMetricFamily(
            f"{PREFIX}_operations",
            "Finished operations by kind and outcome",
            labels=["kind", "outcome"],
        )
        counts = dict(view.operation_counts)
        # Every series exists from the start (at 0), so increase() sees the first one.
        for kind in OPERATION_KINDS:
            for outcome in OUTCOMES:
                ops.add_metric([kind, outcome], float(counts.get((kind, outcome), 0)))
        yield ops
        yield self._operation_running(view)
        if view.last_apply_success_time is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_last_successful_apply_timestamp_seconds",
                "Unix time of the last apply that ended succeeded",
                value=view.last_apply_success_time,
            )
        yield from self._gpus(view)
        yield from self._server(view)
        yield from self._router(view)
        yield from _effect(view)
        if view.slurm is not None:
            yield from _slurm(view.slurm)

    def _router(self, view: SupervisorView) -> Iterator[Metric]:
        """The router integration: whether the server is in the router (only with
        [router]), and the last drain before a stop (the drain phase's durations are in
        phase_duration_seconds{phase="drain"})."""
        router = view.router
        if router is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_router_worker_registered",
                "1 when the sglang-router lists this server (as last seen), else 0",
                value=1.0 if router.get("registered") is True else 0.0,
            )
        if view.last_drain_s is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_last_drain_duration_seconds",
                "How long the last drain before a stop took",
                value=view.last_drain_s,
            )
        if view.last_drain_left is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_last_drain_requests_left",
                "Requests still running or queued when the last drain ended (0: drained)",
                value=view.last_drain_left,
            )

    def _operation_running(self, view: SupervisorView) -> Metric:
        """1 for the kind of the operation running now (a dry run is not one): alerts on
        a server that is down leave out planned work (apply, start, restart, stop)."""
        op = view.operation
        running = GaugeMetricFamily(
            f"{PREFIX}_operation_running",
            "1 while an operation of this kind runs (apply, stop, start, restart are an "
            "operator's; recover restarts a crashed server; shutdown is the daemon's exit)",
            labels=["kind"],
        )
        busy = op is not None and op["state"] == "running" and not op["dry_run"]
        for kind in OPERATION_KINDS:
            running.add_metric(
                [kind], 1.0 if busy and op is not None and op["kind"] == kind else 0.0
            )
        return running

    def _gpus(self, view: SupervisorView) -> Iterator[Metric]:
        # A server spanning Slurm nodes labels its GPUs with their node too (bounded: the
        # allocation's nodes); a one-host server keeps the one label.
        names = ["gpu", "node"] if self.sup.settings.server.launcher == "slurm" else ["gpu"]
        used = GaugeMetricFamily(
            f"{PREFIX}_gpu_memory_used_bytes",
            "GPU memory used, read at scrape time",
            labels=names,
        )
        total = GaugeMetricFamily(
            f"{PREFIX}_gpu_memory_total_bytes", "GPU memory in total", labels=names
        )
        baseline = GaugeMetricFamily(
            f"{PREFIX}_gpu_memory_baseline_bytes",
            "GPU memory used when nothing of ours ran (release is judged against it)",
            labels=names,
        )
        errors = GaugeMetricFamily(
            f"{PREFIX}_gpu_query_ok", "1 when the last GPU query succeeded, 0 when it failed"
        )
        try:
            samples = self.sup.sample_gpus()
        except GpuQueryError:
            errors.add_metric([], 0.0)
            yield errors
            return
        errors.add_metric([], 1.0)
        for s in samples:
            label = [str(s.index), s.node or ""][: len(names)]
            used.add_metric(label, float(s.memory_used_bytes))
            total.add_metric(label, float(s.memory_total_bytes))
            if s.index in view.baseline:
                baseline.add_metric(label, float(view.baseline[s.index]))
        yield from (used, total, baseline, errors)

    def _server(self, view: SupervisorView) -> Iterator[Metric]:
        t = view.throughput
        server = view.server
        if server is not None and server.max_total_num_tokens is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_server_max_total_num_tokens",
                "KV-cache capacity in tokens the server reported at start",
                value=float(server.max_total_num_tokens),
            )
        gauges = (
            (
                "server_gen_throughput_tokens_per_second",
                "Generation throughput (sglang:gen_throughput)",
                t.gen_tokens_per_s,
            ),
            (
                "server_running_requests",
                "Requests decoding now (sglang:num_running_reqs)",
                t.running_requests,
            ),
            (
                "server_queued_requests",
                "Requests waiting (sglang:num_queue_reqs)",
                t.queued_requests,
            ),
            (
                "server_token_usage_ratio",
                "KV-cache token usage, 0..1 (sglang:token_usage)",
                t.token_usage,
            ),
            (
                "server_cache_hit_rate_ratio",
                "Prefix cache hit rate, 0..1 (sglang:cache_hit_rate)",
                t.cache_hit_rate,
            ),
        )
        for name, doc, value in gauges:
            if value is not None:
                yield GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=float(value))
        counters = (
            (
                "server_generation_tokens",
                "Tokens generated (sglang:generation_tokens_total)",
                t.generation_tokens_total,
            ),
            (
                "server_prompt_tokens",
                "Prompt tokens processed (sglang:prompt_tokens_total)",
                t.prompt_tokens_total,
            ),
        )
        for name, doc, value in counters:
            if value is not None:
                yield CounterMetricFamily(f"{PREFIX}_{name}", doc, value=float(value))
        yield GaugeMetricFamily(
            f"{PREFIX}_server_telemetry_from_log",
            "1 when throughput comes from the server's Decode batch log lines, not /metrics",
            value=1.0 if t.source == "log" else 0.0,
        )


#: The last effect's figures as gauges: (name, help, the figure in before/after).
EFFECT_GAUGES = (
    (
        "generation_throughput_tokens_per_second",
        "Generation throughput",
        "generation_throughput_tps",
    ),
    ("running_requests", "Requests running", "running_requests"),
    ("queued_requests", "Requests queued", "queued_requests"),
    ("token_usage_ratio", "KV-cache token usage, 0..1", "token_usage"),
    ("time_to_first_token_seconds", "Mean time to first token", "ttft_s"),
    ("inter_token_latency_seconds", "Mean inter-token latency", "itl_s"),
    ("arrival_rate_requests_per_second", "Requests arriving per second", "arrival_rate_rps"),
)


def _effect(view: SupervisorView) -> Iterator[Metric]:
    """The last apply's measured effect (observe/effect.py): its verdict, each figure
    over the window before and after it, and the effects judged so far by verdict."""
    judged = CounterMetricFamily(
        f"{PREFIX}_effects",
        "Measured effects of applies, by verdict",
        labels=["verdict"],
    )
    for v in VERDICTS[1:]:
        judged.add_metric([v], float(view.effect_counts.get(v, 0)))
    yield judged
    effect = view.effect
    if effect is None:
        return
    last = GaugeMetricFamily(
        f"{PREFIX}_last_effect_verdict",
        "1 for the verdict of the last apply's measured effect (measuring: its window is open)",
        labels=["verdict"],
    )
    for v in VERDICTS:
        last.add_metric([v], 1.0 if effect.get("verdict") == v else 0.0)
    yield last
    for name, doc, figure in EFFECT_GAUGES:
        g = GaugeMetricFamily(
            f"{PREFIX}_last_effect_{name}",
            f"{doc}: mean over the last apply's effect window, before and after it",
            labels=["window"],
        )
        for side in ("before", "after"):
            value = (effect.get(side) or {}).get(figure)
            if value is not None:
                g.add_metric([side], float(value))
        yield g


class _Constant(Collector):
    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterator[Metric]:
        yield self.metric


class SupervisorMetrics:
    """The registry of one supervisor; hooks itself onto the supervisor's operation ends."""

    def __init__(self, sup: Supervisor) -> None:
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self.phase_seconds = Histogram(
            f"{PREFIX}_phase_duration_seconds",
            "Duration of each phase of an operation (a rollback's phases under their base name)",
            ["phase"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.operation_seconds = Histogram(
            f"{PREFIX}_operation_duration_seconds",
            "Duration of whole operations by kind",
            ["kind"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self._collector = _Collector(sup)
        self.registry.register(self._collector)
        build = GaugeMetricFamily(
            f"{PREFIX}_build_info",
            "Always 1; the daemon's version and Python in the labels",
            labels=["version", "python_version"],
        )
        build.add_metric([version(), python_version()], 1.0)
        self.registry.register(_Constant(build))
        # The daemon process: sglang_supervisor_process_cpu_seconds_total, _resident_memory_bytes,
        # _open_fds... (one prefix for every name, as the design asks)
        ProcessCollector(namespace=PREFIX, registry=self.registry)
        sup.on_operation_end.append(self.observe)

    def observe(self, op: Operation) -> None:
        for ph in op.phases:
            label = phase_label(ph.name)
            if label is not None and ph.duration_s is not None:
                self.phase_seconds.labels(label).observe(ph.duration_s)
        if op.kind in OPERATION_KINDS and op.duration_s is not None and not op.dry_run:
            self.operation_seconds.labels(op.kind).observe(op.duration_s)

    def render(self, view: SupervisorView | None = None) -> bytes:
        """The exposition text; ``view`` is the supervisor as seen on the event loop
        (blocking: GPU memory is sampled now)."""
        with self._lock:
            self._collector.view = view
            try:
                return generate_latest(self.registry)
            finally:
                self._collector.view = None
