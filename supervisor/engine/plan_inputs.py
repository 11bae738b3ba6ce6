"""What ``POST /plan`` needs of the engine, taken in one call on the event loop
(``Supervisor.plan_inputs``): the frozen view, the backend, the stop deadlines, what a
change's time without service is estimated from (``server_facts``: also the apply's), and
SGLang's own resolution bound to this daemon's interpreter, environment and GPUs.

The planner runs in worker threads; nothing it holds reads the ``Supervisor`` there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ReadRecord
from sglang_supervisor.engine.server import launch_flags, server_env
from sglang_supervisor.engine.validation import gpu_facts
from sglang_supervisor.engine.view import SupervisorView
from sglang_supervisor.host.backend import Backend
from sglang_supervisor.planner.downtime import ServerFacts
from sglang_supervisor.planner.stopcost import MEASURED_RATES, StopBudget
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.sglang.parser import ParserUnavailable
from sglang_supervisor.sglang.resolution import Verdict, resolve_levers

#: SGLang's verdict on a lever set (the current levers' env; None: SGLang could not be asked).
AskSglang = Callable[[Mapping[str, Any]], Verdict | None]


@dataclass(frozen=True)
class PlanInputs:
    """Everything a plan reads of the daemon, frozen at the request."""

    view: SupervisorView
    #: The backend: its own model (``plan_model``) and load (``plan_avg_tokens``) hooks.
    backend: Backend
    #: The daemon's stop deadlines (what a plan's stop would cost).
    stop: StopBudget
    #: SGLang's own resolution in the server's interpreter, environment and working
    #: directory, with the managed GPUs' facts; None where it cannot run (no live SGLang,
    #: its resolution degraded, or the GPUs unknown): the planner's formulas answer.
    #: Blocking (seconds the first time): call it from a worker thread.
    ask_sglang: AskSglang | None
    #: The timeouts, router and measured start a change's downtime is estimated from.
    facts: ServerFacts = field(default_factory=ServerFacts)


def plan_inputs(parts: Parts, record: ReadRecord, view: SupervisorView) -> PlanInputs:
    """``Supervisor.plan_inputs``: read everything now, on the event loop."""
    t = parts.settings.timeouts
    stop = StopBudget(
        budget_s=t.stop_budget_s,
        stop_grace_s=t.stop_grace_s,
        kill_timeout_s=t.kill_timeout_s,
        release_timeout_s=t.release_timeout_s,
        release_s_per_pinned_gib=t.release_s_per_pinned_gib,
    )
    return PlanInputs(
        view=view,
        backend=parts.backend,
        stop=stop,
        ask_sglang=_sglang_asker(parts, record),
        facts=server_facts(parts, record),
    )


def server_facts(parts: Parts, record: ReadRecord, drain_s: float = 0.0) -> ServerFacts:
    """What a change's expected time without service reads of this daemon now: its
    timeouts, its router, the load in flight and the serving server's measured start
    (``drain_s``: an apply's own drain bound; behind a router, the router's)."""
    t = parts.settings.timeouts
    routed = parts.router.enabled
    load = record.throughput
    in_flight = None
    if load.running_requests is not None or load.queued_requests is not None:
        in_flight = (load.running_requests or 0) + (load.queued_requests or 0)
    server = record.server
    return ServerFacts(
        stop_grace_s=t.stop_grace_s,
        probation_s=t.probation_s,
        drain_s=parts.settings.router.drain_timeout_s if routed else drain_s,
        behind_router=routed,
        in_flight=in_flight,
        measured_start_s=None if server is None else server.start_s,
        rates=parts.backend.pin_rates or MEASURED_RATES,
    )


def _sglang_asker(parts: Parts, record: ReadRecord) -> AskSglang | None:
    if not parts.schema_live or not record.sglang.resolution_runs:
        return None  # the plan's notes say why (api/plan.py sglang_notes)
    facts = gpu_facts(parts, record.managed)
    if facts is None:
        return None
    # Bound now: the worker thread that asks reads nothing of the record or the parts.
    lever_env = dict(record.levers.env)
    env = server_env(
        parts, record.managed, LeverSet({}, lever_env)
    )  # the levers' env is the current one
    schema, server = parts.schema, parts.settings.server

    def ask(levers: Mapping[str, Any]) -> Verdict | None:
        try:
            return resolve_levers(
                server.python,
                launch_flags(LeverSet(dict(levers), lever_env), schema, server),
                env,
                facts,
                cwd=server.cwd,
            )
        except ParserUnavailable:
            return None

    return ask
