"""What ``POST /plan`` needs of the engine, taken in one call on the event loop
(``Supervisor.plan_inputs``): the frozen view, the backend, the stop deadlines, and SGLang's
own resolution bound to this daemon's interpreter, environment and GPUs.

The planner runs in worker threads; nothing it holds reads the ``Supervisor`` there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sglang_supervisor.engine.server import launch_flags, server_env
from sglang_supervisor.engine.validation import gpu_facts
from sglang_supervisor.engine.view import SupervisorView
from sglang_supervisor.host.backend import Backend
from sglang_supervisor.planner.stopcost import StopBudget
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.sglang.parser import ParserUnavailable
from sglang_supervisor.sglang.resolution import Verdict, resolve_levers

if TYPE_CHECKING:
    from sglang_supervisor.engine.supervisor import Supervisor

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


def plan_inputs(sup: Supervisor) -> PlanInputs:
    """``Supervisor.plan_inputs``: read everything now, on the event loop."""
    t = sup.settings.timeouts
    stop = StopBudget(
        budget_s=t.stop_budget_s,
        stop_grace_s=t.stop_grace_s,
        kill_timeout_s=t.kill_timeout_s,
        release_timeout_s=t.release_timeout_s,
        release_s_per_pinned_gib=t.release_s_per_pinned_gib,
    )
    return PlanInputs(
        view=sup.view(), backend=sup.backend, stop=stop, ask_sglang=_sglang_asker(sup)
    )


def _sglang_asker(sup: Supervisor) -> AskSglang | None:
    if not sup.schema_live or not sup.sglang.resolution_runs:
        return None  # the plan's notes say why (api/plan.py sglang_notes)
    facts = gpu_facts(sup)
    if facts is None:
        return None
    # Bound now: the worker thread that asks reads none of the Supervisor's attributes.
    lever_env = dict(sup.levers.env)
    env = server_env(sup, LeverSet({}, lever_env))  # the levers' env is the current one
    schema, server = sup.schema, sup.settings.server

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
