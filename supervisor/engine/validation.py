"""Validation of a lever set before the stop: the schema and lever limits, then SGLang's
own verdict (its parser, resolution pipeline and checks, run by
``sglang_supervisor.sglang.resolution``), the degraded paths when SGLang cannot answer, and the
checks that did not run. Nothing here changes anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from sglang_supervisor.engine.server import flags, server_env
from sglang_supervisor.engine.sglang_info import CHECKING, after_helper
from sglang_supervisor.planner.sharding import model_dir_sharding_problems
from sglang_supervisor.sglang.lever_limits import launch_topology_problems
from sglang_supervisor.sglang.lever_paths import path_kinds
from sglang_supervisor.sglang.levers import (
    LeverError,
    LeverProblem,
    LeverSet,
    check_gpu_placement,
    check_levers,
)
from sglang_supervisor.sglang.parser import (
    ParserUnavailable,
    check_argv,
    lever_for_message,
    levers_for_message,
)
from sglang_supervisor.sglang.resolution import (
    GpuFacts,
    ResolutionUnavailable,
    Verdict,
    default_resolver,
    resolve_levers,
)
from sglang_supervisor.slurm.settings import check_node_levers

if TYPE_CHECKING:
    from sglang_supervisor.engine.supervisor import Supervisor

log = logging.getLogger("supervisor")


def not_run_of(sup: Supervisor, verdict: Verdict | None) -> list[dict[str, str]]:
    """The validate phase's checks that did not run, each with why (structured)."""
    if verdict is not None:
        return [dict(n) for n in verdict.not_run]
    if not sup.schema_live:
        return [
            {
                "check": "SGLang's own parser, resolution and check_server_args",
                "reason": f"{sup.settings.server.python} cannot run SGLang here "
                f"({sup.schema_warning or 'no SGLang'}); only the schema was checked",
            }
        ]
    return [
        {
            "check": "SGLang's resolution and check_server_args",
            "reason": "the managed GPUs' compute capability is unknown; only SGLang's parser ran",
        }
    ]


def gpu_facts(sup: Supervisor) -> GpuFacts | None:
    """What SGLang would read from CUDA, from the managed GPUs (None: unknown GPU)."""
    managed = sup.managed
    if managed and sup.settings.server.launcher == "slurm":
        # SGLang on each node sees that node's GPUs only (named <node>/<uuid> across the
        # nodes, supervisor/slurm/probe.py): one node's facts, the first node's.
        first_node = managed[0].uuid.partition("/")[0]
        managed = [g for g in managed if g.uuid.partition("/")[0] == first_node]
    if not managed:
        return None
    if sup.backend.name == "simulated":
        mib = min(g.memory_total_bytes for g in managed) >> 20
        return GpuFacts.simulated(len(managed), mib)
    # The compute capability and driver version NVML reports (the table of GPU names
    # only where NVML could not say).
    first = managed[0]
    return GpuFacts.of_gpus(
        [g.name for g in managed],
        [g.memory_total_bytes for g in managed],
        capability=first.capability,
        driver_version=first.driver_version,
    )


async def warm_resolution(sup: Supervisor) -> None:
    """Start SGLang's resolution helper for the current levers' environment now: its
    import takes seconds, so that the first apply does not wait for it."""
    facts = gpu_facts(sup)
    if not sup.schema_live or facts is None:
        return
    env = server_env(sup, sup.levers)
    try:
        await asyncio.to_thread(
            default_resolver().warm, sup.settings.server.python, env, facts, sup.settings.server.cwd
        )
    except ParserUnavailable as exc:
        log.warning("SGLang's resolution helper did not start: %s", exc)


async def check_sglang(sup: Supervisor) -> None:
    """Ask the resolution helper which SGLang it imported (seconds: the import) and
    whether it has the entry points the resolution needs; /status's ``sglang`` and its
    warnings say so. Never raises: a failure is a degraded validation, said."""
    facts = gpu_facts(sup)
    if sup.sglang.validation != CHECKING or facts is None:
        return
    env = server_env(sup, sup.levers)
    try:
        said = await asyncio.to_thread(
            default_resolver().which_sglang,
            sup.settings.server.python,
            env,
            facts,
            sup.settings.server.cwd,
        )
    except ParserUnavailable as exc:
        if sup.stop_request.requested:
            return  # the daemon closes and its helpers with it: not a degraded SGLang
        sup.sglang = sup.sglang.degraded(f"SGLang's resolution helper failed: {exc}")
    else:
        sup.sglang = after_helper(sup.sglang, said)
    if sup.sglang.reason is not None:
        log.warning("%s", sup.sglang.reason)
        sup.warn(sup.sglang.reason)


async def _degraded(
    sup: Supervisor, checked: LeverSet, detail: str
) -> tuple[LeverSet, str, Verdict | None]:
    """Stage (b) when SGLang's resolution cannot run (``sup.sglang`` says why): its
    parser and checks where it has them, else the schema alone — said in the detail."""
    info = sup.sglang
    why = f"validation degraded: {info.reason}"
    if any(m.endswith(".prepare_server_args") for m in info.missing):
        return checked, f"{detail}; {why}", None
    return await _parse_only(sup, checked, detail, why)


async def validate_with_sglang(
    sup: Supervisor, requested: LeverSet
) -> tuple[LeverSet, str, Verdict | None]:
    """Check a full lever set in two stages; raises ``LeverError`` naming every bad lever.

    (a) the schema and the lever limits: exact names, types, choices, owned flags,
    SGLang's required flags and basic ranges, text an argv/env can carry and its size,
    GPU ids within the managed GPUs, the env allowlist;
    (b) SGLang's own launch-time validation, in the server's interpreter, environment and
    working directory: ``prepare_server_args``, its resolution pipeline and
    ``check_server_args``, with the managed GPUs' facts (``sglang_supervisor.sglang.resolution``).
    Skipped, with a warning in /status, when the interpreter has no SGLang.
    Returns the canonical set, a line saying what ran (and what did not), and SGLang's
    verdict (None when (b) did not run).
    """
    t0 = time.monotonic()
    checked = check_levers(requested, sup.schema, complete=True)
    check_gpu_placement(checked, len(sup.managed))
    # Layouts SGLang fails building the model for (head counts vs tp, experts vs ep).
    sharding = await asyncio.to_thread(model_dir_sharding_problems, checked.levers)
    if sharding:
        raise LeverError([LeverProblem(lever, msg) for lever, msg in sharding])
    collisions = launch_topology_problems(
        checked.levers, server_port=sup.settings.server.port, api_port=sup.settings.api.port
    )
    if collisions:
        raise LeverError([LeverProblem(lever, msg) for lever, msg in collisions])
    nodes = check_node_levers(checked.levers, sup.settings.server.launcher, len(sup.managed))
    if nodes:
        raise LeverError([LeverProblem(lever, message) for lever, message in nodes])
    detail = f"schema of SGLang {sup.schema.sglang_version}: {(time.monotonic() - t0) * 1e3:.1f} ms"
    if not sup.schema_live:
        return checked, detail + "; SGLang's own parser and resolution not available", None
    facts = gpu_facts(sup)
    if facts is None:
        return await _parse_only(sup, checked, detail)
    if not sup.sglang.resolution_runs:
        return await _degraded(sup, checked, detail)
    try:
        verdict = await asyncio.to_thread(
            resolve_levers,
            sup.settings.server.python,
            flags(sup, checked),
            server_env(sup, checked),
            facts,
            cwd=sup.settings.server.cwd,
            paths=path_kinds(sup.schema),
        )
    except ResolutionUnavailable as exc:
        sup.sglang = sup.sglang.degraded(str(exc))
        sup.sglang = replace(sup.sglang, missing=exc.missing)
        sup.warn(f"validation degraded: {exc}")
        return await _degraded(sup, checked, detail)
    except ParserUnavailable as exc:
        problem = LeverProblem("levers", f"cannot run SGLang's resolution: {exc}")
        raise LeverError([problem]) from exc
    if verdict.problems:
        raise LeverError(
            [
                LeverProblem(p["lever"], p["message"] + " (checked where the server runs)")
                for p in verdict.problems
            ]
        )
    if not verdict.ok:
        raise LeverError([_refusal(sup, checked, verdict)])
    return checked, detail + "; " + describe_verdict(verdict), verdict


def _refusal(sup: Supervisor, checked: LeverSet, verdict: Verdict) -> LeverProblem:
    message = verdict.message or "refused"
    named = levers_for_message(message, sup.schema, list(checked.levers), checked.levers)
    lever = named[0] if named else "levers"
    what = {"parse": "parser", "resolve": "launch-time resolution"}.get(
        verdict.stage or "", "launch checks"
    )
    where = f" at {verdict.where}" if verdict.where else ""
    also = f" (levers involved: {', '.join(named)})" if len(named) > 1 else ""
    return LeverProblem(
        lever,
        f"SGLang {verdict.sglang_version or sup.schema.sglang_version}'s {what} refused it"
        f"{where}: {message}{also}",
    )


#: Resolved values named in the validate phase's detail (all of them are in the
#: operation's ``resolved``).
_SHOWN = (
    "mem_fraction_static",
    "chunked_prefill_size",
    "max_running_requests",
    "cuda_graph_max_bs",
    "page_size",
    "attention_backend",
)


def describe_verdict(verdict: Verdict) -> str:
    """One line: how long SGLang took, what it resolved, and what did not run."""
    text = f"SGLang's parser, resolution and checks: {verdict.duration_s:.2f} s"
    shown = [
        f"{k} {verdict.resolved[k]}"
        for k in _SHOWN
        if k in verdict.resolved and verdict.resolved[k] is not None
    ]
    if shown:
        text += "; resolved " + ", ".join(shown)
    if verdict.resolved.get("max_running_requests") is None and verdict.resolved:
        text += ", max_running_requests decided at start-up from the KV pool"
    if verdict.not_run:
        text += "; not run: " + "; ".join(
            f"{n['check']} ({n['reason']})" if n.get("reason") else n["check"]
            for n in verdict.not_run
        )
    return text


async def _parse_only(
    sup: Supervisor,
    checked: LeverSet,
    detail: str,
    why: str = "the managed GPUs' compute capability is unknown",
) -> tuple[LeverSet, str, Verdict | None]:
    """Stage (b) without resolution, when the managed GPUs' facts are unknown."""
    try:
        verdict = await asyncio.to_thread(
            check_argv, sup.settings.server.python, flags(sup, checked)
        )
    except ParserUnavailable as exc:
        problem = LeverProblem("levers", f"cannot run SGLang's parser: {exc}")
        raise LeverError([problem]) from exc
    if not verdict.ok:
        message = verdict.message or "refused"
        lever = lever_for_message(message, sup.schema, list(checked.levers))
        raise LeverError(
            [LeverProblem(lever, f"SGLang {sup.schema.sglang_version} refused it: {message}")]
        )
    return (
        checked,
        detail + f"; SGLang's parser: {verdict.duration_s:.2f} s; not run: SGLang's "
        f"resolution ({why})",
        None,
    )
