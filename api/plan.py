"""``POST /plan``: the planner's proposal for the running Supervisor's server.

Every input defaults to what the daemon knows: the model from the current levers'
``model_path`` (a local directory, or the Hugging Face cache; on the simulated backend the
simulated server's model), the managed GPUs and their memory, the host's available RAM
(the simulated host's in simulate mode) and the live server's load. The answer is
``sglang_supervisor.planner.Plan.to_json()``; its ``levers`` can be sent as is to
``POST /levers``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request

from sglang_supervisor import planner
from sglang_supervisor.engine import PlanInputs, SupervisorView
from sglang_supervisor.host import preflight
from sglang_supervisor.host.backend import Backend
from sglang_supervisor.host.gpu import GpuInfo
from sglang_supervisor.observe.startuplog import launch_graph_seconds
from sglang_supervisor.planner import Hardware, LiveLoad, ModelSpec, Plan, PlanError
from sglang_supervisor.planner.downtime import ServerFacts
from sglang_supervisor.planner.hostpool import DevicePool, ratio_host_bytes_per_rank
from sglang_supervisor.planner.nodes import NodeShare
from sglang_supervisor.planner.proposal import Resolver, Validator
from sglang_supervisor.planner.served import read_launch_log, with_served
from sglang_supervisor.planner.stopcost import StopBudget
from sglang_supervisor.redact import redact
from sglang_supervisor.sglang.layout import Layout
from sglang_supervisor.sglang.resolution import Verdict
from sglang_supervisor.states import ServerState
from sglang_supervisor.units import GiB
from sglang_supervisor_api.plan_request import PlanRequest, resolve_model
from sglang_supervisor_api.routes import SupervisorDep

router = APIRouter()


def _refused(message: str) -> HTTPException:
    return HTTPException(status_code=422, detail={"message": message})


def sglang_oracle(
    inputs: PlanInputs, body: PlanRequest | None = None
) -> tuple[Validator | None, Resolver | None]:
    """SGLang's own resolution pipeline, in the server's interpreter, as the planner's
    validator (a candidate it refuses is never proposed) and source of defaults (its
    resolved ``mem_fraction_static``); (None, None) where SGLang is not installed or the
    GPUs are unknown: the planner's formulas are the fallback. Each lever set is asked
    once per plan.

    SGLang is asked about the model planned for: the request's ``model`` directory in
    place of the running one's ``model_path``; an inline ``config_json`` has no directory
    SGLang could read, so the planner's formulas answer (never the running model's
    figures under another model's name)."""
    ask_sglang = inputs.ask_sglang
    if ask_sglang is None:
        return None, None  # make_plan says why (sglang_notes)
    if body is not None and body.config_json is not None:
        return None, None
    model_path = str(Path(body.model).expanduser()) if body and body.model else None
    answers: dict[str, Verdict | None] = {}

    def ask(levers: Mapping[str, Any]) -> Verdict | None:
        asked = dict(levers) if model_path is None else {**levers, "model_path": model_path}
        key = json.dumps(asked, sort_keys=True, default=str)
        if key not in answers:
            answers[key] = ask_sglang(asked)
        return answers[key]

    def validate(levers: Mapping[str, Any]) -> str | None:
        verdict = ask(levers)
        if verdict is None or verdict.ok:
            return None
        where = f" at {verdict.where}" if verdict.where else ""
        return f"SGLang {verdict.sglang_version or ''} refuses it{where}: {verdict.message}"

    def resolve(levers: Mapping[str, Any]) -> Mapping[str, Any] | None:
        verdict = ask(levers)
        return verdict.resolved if verdict is not None and verdict.ok else None

    return validate, resolve


def node_gpus(managed: tuple[GpuInfo, ...]) -> tuple[list[GpuInfo], int]:
    """One node's managed GPUs and the node count. Under the Slurm launcher the managed
    GPUs are every node's, numbered node by node and named ``<node>/<uuid>``
    (``sglang_supervisor.slurm.probe``): SGLang on each node sees its own node's GPUs
    only, so a plan counts one node's — the smallest node's — not all of them as one host.
    NVML's and the simulated GPUs' uuids carry no ``/``: one host."""
    by_node: dict[str, list[GpuInfo]] = {}
    for g in managed:
        node, slash, _ = g.uuid.partition("/")
        by_node.setdefault(node if slash else "", []).append(g)
    if len(by_node) <= 1:
        return list(managed), 1
    return min(by_node.values(), key=len), len(by_node)


def _hardware(body: PlanRequest, view: SupervisorView, model: ModelSpec | None = None) -> Hardware:
    """The GPUs and host RAM to plan for: the request's, else what the daemon manages
    (``model``: the running server's, when the plan is for it — its explicit
    ``hicache_ratio`` pool is then sized as SGLang sized it)."""
    managed, nodes = node_gpus(view.managed)
    simulated = view.backend == "simulated"
    what = f"{len(managed)} simulated GPUs" if simulated else f"{len(managed)} managed GPUs"
    if nodes > 1:
        what += f" per node ({nodes} Slurm nodes, {len(view.managed)} in all)"
    if body.gpu_memory_gib is not None:
        gpu_bytes = int(body.gpu_memory_gib * GiB)
    elif managed:
        gpu_bytes = min(g.memory_total_bytes for g in managed)
    else:
        raise PlanError("the daemon knows no GPUs yet: pass gpus and gpu_memory_gib")
    gpus = body.gpus or len(managed)
    sources = {"given" if body.gpus else what, "given" if body.gpu_memory_gib else what}
    gpu_source = " and ".join(sorted(sources))
    if body.host_ram_gib is not None:
        ram, ram_source = int(body.host_ram_gib * GiB), "given"
    else:
        facts = preflight.host_facts(view.simulated_host_ram_bytes)
        ram, ram_source = facts.available_ram_bytes, f"{facts.ram_source} RAM available"
        server = view.server
        if not simulated and server is not None:
            # As preflight counts it: the running server's host pool is freed by the apply.
            running = server.levers.levers
            pool = DevicePool.of(model, running, gpu_bytes) if model is not None else None
            by_ratio = ratio_host_bytes_per_rank(running, pool)
            # This host's ranks only: each node pins its own share (planner.nodes).
            share = NodeShare.of(running)
            freed = (
                share.ranks_per_node * by_ratio
                if by_ratio
                else preflight.pinned_host_bytes(running, gpu_bytes) // share.nnodes
            )
            if freed:
                ram += freed
                ram_source += f" + {freed / GiB:.0f} GiB the running server's host cache frees"
    return Hardware(
        gpus=gpus,
        gpu_memory_bytes=gpu_bytes,
        host_ram_available_bytes=ram,
        gpu_source=gpu_source,
        host_ram_source=ram_source,
    )


def served_model(model: ModelSpec, view: SupervisorView, gpu_bytes: int) -> ModelSpec:
    """``model`` with the running server's own sizing, when the plan is for the lever set
    it serves and it reported its pool (``/server_info``'s ``max_total_num_tokens``, else
    its launch log's); its launch log adds the fraction it resolved and the weights it
    loaded (``planner.served``). Blocking: reads the launch log."""
    server = view.server
    if server is None or view.state != ServerState.READY:
        return model
    if server.levers.levers != view.levers.levers:
        return model  # the figures are another set's
    log = read_launch_log(server.log_path)
    tokens = server.max_total_num_tokens or log.kv_tokens
    if not tokens:
        return model
    where = "/server_info" if server.max_total_num_tokens else "its launch log"
    if log.mem_fraction_static is not None or log.weight_bytes_per_rank is not None:
        where += f" and the launch log {server.log_path}"
    return with_served(
        model,
        view.levers.levers,
        gpu_bytes,
        max_total_num_tokens=int(tokens),
        log=log,
        source=where,
    )


def _live(view: SupervisorView) -> LiveLoad | None:
    t = view.throughput
    if view.state != ServerState.READY or t.source is None:
        return None
    return LiveLoad(
        running_requests=t.running_requests,
        queued_requests=t.queued_requests,
        token_usage=t.token_usage,
        gen_tokens_per_s=t.gen_tokens_per_s,
        cache_hit_rate=t.cache_hit_rate,
        max_total_num_tokens=None if view.server is None else view.server.max_total_num_tokens,
        used_tokens=t.used_tokens,
        kv_pools=Layout.of(view.levers.levers).kv_pools,
        prefix_cache=None if view.diagnosis is None else view.diagnosis.prefix_cache,
        held=None if view.diagnosis is None else view.diagnosis.kind,
    )


def _avg_tokens(
    body: PlanRequest, view: SupervisorView, backend: Backend, live: LiveLoad | None
) -> tuple[int, str]:
    if body.avg_tokens is not None:
        return body.avg_tokens, "given"
    measured = live.avg_tokens() if live is not None else None
    if measured is not None:
        how = "KV tokens in use" if live and live.used_tokens else "token usage × pool size"
        return measured, f"live: {how} / running requests"
    if backend.plan_avg_tokens is not None:
        implied = backend.plan_avg_tokens({**view.backend_env, **view.levers.env})
        if implied is not None:
            return implied
    return planner.DEFAULT_AVG_TOKENS, "assumed (no live load; pass avg_tokens)"


def sglang_notes(view: SupervisorView, *, asked: bool) -> list[str]:
    """What the plan owes to which SGLang: never silently the planner's own rule."""
    info = view.sglang or {}
    notes = []
    if not asked:
        why = info.get("reason") or "SGLang's resolution is not available"
        notes.append(
            f"SGLang's own resolution was not asked ({why}): the planner's own rule "
            f"(SGLang {info.get('knowledge_from')}'s formulas) decided the defaults and "
            "nothing was checked against SGLang"
        )
    elif info.get("version") and info.get("version") != info.get("knowledge_from"):
        notes.append(
            f"SGLang {info.get('version')} answered (its resolution checked every "
            f"candidate), but the planner's formulas are SGLang {info.get('knowledge_from')}'s"
            " own knowledge: capacity figures may not match this version"
        )
    return notes


async def make_plan(
    body: PlanRequest,
    view: SupervisorView,
    backend: Backend,
    oracle: tuple[Validator | None, Resolver | None] | None = None,
    stop: StopBudget | None = None,
    facts: ServerFacts | None = None,
) -> dict[str, Any]:
    """The proposal as JSON. ``PlanError`` when it cannot be made.

    The daemon's state is read on the event loop; reading the model directory (and the
    serving launch's log, for its measured CUDA-graph capture) runs in a worker thread.
    ``facts``: the daemon's timeouts, router and measured start, for the expected time
    without service (``PlanInputs.facts``).
    """
    model = await asyncio.to_thread(
        resolve_model,
        body,
        model_path=str(view.levers.levers.get("model_path") or ""),
        backend=backend,
        env={**os.environ, **view.backend_env, **view.levers.env},
    )
    own = body.model is None and body.config_json is None
    # The host's RAM and cgroup limits are /proc and /sys reads: off the event loop too
    # (``view`` is a frozen snapshot, safe to read there).
    hardware = await asyncio.to_thread(_hardware, body, view, model if own else None)
    hardware = replace(hardware, stop=stop)
    if own:
        # The running server's own sizing (its /server_info and launch log) beats the
        # formula: the launch log is a file read, off the event loop.
        model = await asyncio.to_thread(served_model, model, view, hardware.gpu_memory_bytes)
    live = _live(view)
    avg, avg_source = _avg_tokens(body, view, backend, live)
    validate, resolve = oracle if oracle is not None else (None, None)
    if facts is not None and own and view.server is not None:
        each = await asyncio.to_thread(launch_graph_seconds, view.server.log_path)
        facts = replace(facts, graph_s_each=each)
    if facts is not None and not own:
        # Another model than the one serving: its start was not measured here.
        facts = replace(facts, measured_start_s=None, graph_s_each=None)
    # SGLang's own resolution blocks (seconds the first time): off the event loop.
    plan: Plan = await asyncio.to_thread(
        planner.propose,
        model,
        hardware,
        dict(view.levers.levers),
        avg_tokens=avg,
        avg_tokens_source=avg_source,
        target_concurrency=body.target_concurrency,
        live=live,
        validate=validate,
        resolve=resolve,
        facts=facts,
    )
    out = plan.to_json()
    unknown = [k for k in plan.levers if k not in view.schema.flags]
    if unknown:
        # A different SGLang than the bundled 0.5.23 may lack a lever: leave it out.
        out["levers"] = {k: v for k, v in plan.levers.items() if k not in unknown}
        out["notes"].append(
            f"SGLang {view.schema.sglang_version} has no {', '.join(unknown)}; left out of "
            "the proposal"
        )
    served = model.served.note() if model.served is not None else None
    if served is not None:
        out["notes"].insert(0, served)
    out["sglang"] = None if view.sglang is None else dict(view.sglang)
    out["notes"].extend(sglang_notes(view, asked=validate is not None))
    out["apply"] = {
        "method": "POST",
        "path": "/levers?wait=true",
        "body": {"levers": out["levers"]},
    }
    return out


#: Plans computed at once; more wait (each reads a model's files and holds its config:
#: bounded, not multiplied by every caller at once).
PLANS_AT_ONCE = 2


def _plan_slots(request: Request) -> asyncio.Semaphore:
    slots: asyncio.Semaphore | None = getattr(request.app.state, "plan_slots", None)
    if slots is None:  # one per app, made on its loop
        slots = request.app.state.plan_slots = asyncio.Semaphore(PLANS_AT_ONCE)
    return slots


@router.post("/plan")
async def post_plan(
    request: Request, sup: SupervisorDep, body: PlanRequest | None = None
) -> dict[str, Any]:
    """The planner's proposal: current vs proposed capacity and the levers to apply.

    422 when the model cannot be found or read, or the inputs cannot be planned for.
    """
    try:
        body = body or PlanRequest()
        async with _plan_slots(request):
            inputs = sup.plan_inputs()  # as of when this plan's turn came
            oracle = sglang_oracle(inputs, body)
            out = await make_plan(
                body, inputs.view, inputs.backend, oracle, inputs.stop, inputs.facts
            )
        # Secrets among the current levers (api_key...) are not shown; the proposal's own
        # levers are capacity levers, kept as they are so they can be sent to POST /levers.
        return {**redact(out), "levers": out["levers"], "apply": out["apply"]}
    except PlanError as exc:
        raise _refused(str(exc)) from exc
    except (ArithmeticError, ValueError) as exc:  # a config.json with impossible values
        raise _refused(f"cannot plan for this model: {type(exc).__name__}: {exc}") from exc
