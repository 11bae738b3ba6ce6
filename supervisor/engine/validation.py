"""Validation of a lever set before the stop: the schema and lever limits, then SGLang's
own verdict (its parser, resolution pipeline and checks, run by
``sglang_supervisor.sglang.resolution``), the degraded paths when SGLang cannot answer, and the
checks that did not run. Nothing here changes anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import replace

from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ReadRecord, ServerRecord
from sglang_supervisor.engine.server import flags, server_env
from sglang_supervisor.engine.sglang_info import CHECKING, after_helper
from sglang_supervisor.engine.stop_request import StopRequest
from sglang_supervisor.host.gpu import GpuInfo
from sglang_supervisor.planner.sharding import model_dir_sharding_problems
from sglang_supervisor.sglang.lever_limits import launch_topology_problems
from sglang_supervisor.sglang.lever_paths import (
    PathChecksUnavailable,
    check_where_the_server_runs,
    path_kinds,
)
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
    refusal_levers,
)
from sglang_supervisor.sglang.resolution import (
    GpuFacts,
    ResolutionUnavailable,
    Verdict,
    default_resolver,
    resolve_levers,
)
from sglang_supervisor.slurm.settings import check_node_levers

log = logging.getLogger("supervisor")


def not_run_of(parts: Parts, verdict: Verdict | None) -> list[dict[str, str]]:
    """The validate phase's checks that did not run, each with why (structured)."""
    if verdict is not None:
        return [dict(n) for n in verdict.not_run]
    if not parts.schema_live:
        return [
            {
                "check": "SGLang's own parser, resolution and check_server_args",
                "reason": f"{parts.settings.server.python} cannot run SGLang here "
                f"({parts.schema_warning or 'no SGLang'}); only the schema, the lever "
                "limits and the levers' paths were checked",
            }
        ]
    return [
        {
            "check": "SGLang's resolution and check_server_args",
            "reason": "the managed GPUs' compute capability is unknown; only SGLang's parser ran",
        }
    ]


def gpu_facts(parts: Parts, managed: Sequence[GpuInfo]) -> GpuFacts | None:
    """What SGLang would read from CUDA, from the managed GPUs (None: unknown GPU)."""
    if managed and parts.settings.server.launcher == "slurm":
        # SGLang on each node sees that node's GPUs only (named <node>/<uuid> across the
        # nodes, supervisor/slurm/probe.py): one node's facts, the first node's.
        first_node = managed[0].uuid.partition("/")[0]
        managed = [g for g in managed if g.uuid.partition("/")[0] == first_node]
    if not managed:
        return None
    if parts.backend.name == "simulated":
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


async def warm_resolution(parts: Parts, record: ReadRecord) -> None:
    """Start SGLang's resolution helper for the current levers' environment now: its
    import takes seconds, so that the first apply does not wait for it."""
    facts = gpu_facts(parts, record.managed)
    if not parts.schema_live or facts is None:
        return
    env = server_env(parts, record.managed, record.levers)
    try:
        await asyncio.to_thread(
            default_resolver().warm,
            parts.settings.server.python,
            env,
            facts,
            parts.settings.server.cwd,
        )
    except ParserUnavailable as exc:
        log.warning("SGLang's resolution helper did not start: %s", exc)


async def check_sglang(parts: Parts, record: ServerRecord, stop: StopRequest) -> None:
    """Ask the resolution helper which SGLang it imported (seconds: the import) and
    whether it has the entry points the resolution needs; /status's ``sglang`` and its
    warnings say so. Never raises: a failure is a degraded validation, said."""
    facts = gpu_facts(parts, record.managed)
    if record.sglang.validation != CHECKING or facts is None:
        return
    env = server_env(parts, record.managed, record.levers)
    try:
        said = await asyncio.to_thread(
            default_resolver().which_sglang,
            parts.settings.server.python,
            env,
            facts,
            parts.settings.server.cwd,
        )
    except ParserUnavailable as exc:
        if stop.requested:
            return  # the daemon closes and its helpers with it: not a degraded SGLang
        record.sglang_learned(record.sglang.degraded(f"SGLang's resolution helper failed: {exc}"))
    else:
        record.sglang_learned(after_helper(record.sglang, said))
    if record.sglang.reason is not None:
        log.warning("%s", record.sglang.reason)
        record.warn(record.sglang.reason)


async def _degraded(
    parts: Parts, record: ReadRecord, checked: LeverSet, detail: str
) -> tuple[LeverSet, str, Verdict | None]:
    """Stage (b) when SGLang's resolution cannot run (``record.sglang`` says why): its
    parser and checks where it has them, else the schema alone — said in the detail."""
    info = record.sglang
    why = f"validation degraded: {info.reason}"
    if any(m.endswith(".prepare_server_args") for m in info.missing):
        paths = await _paths_here(parts, record, checked)
        return checked, f"{detail}; {paths}; {why}", None
    return await _parse_only(parts, record, checked, detail, why)


async def _paths_here(parts: Parts, record: ReadRecord, checked: LeverSet) -> str:
    """Where SGLang's resolution probe does not run (it checks them itself): the path-
    and JSON-valued levers checked by this daemon against the server's working directory
    (``lever_paths.check_where_the_server_runs``, in a worker thread).
    Raises ``LeverError`` naming each; returns what ran, for the validate phase."""
    t0 = time.monotonic()
    try:
        problems = await asyncio.to_thread(
            check_where_the_server_runs,
            checked.levers,
            path_kinds(parts.schema),
            parts.settings.server.cwd,
        )
    except PathChecksUnavailable as exc:
        raise LeverError([LeverProblem("levers", str(exc))]) from exc
    if problems:
        raise LeverError(
            [
                LeverProblem(p["lever"], p["message"] + " (checked where the server runs)")
                for p in problems
            ]
        )
    return f"the levers' paths checked: {(time.monotonic() - t0) * 1e3:.0f} ms"


async def validate_with_sglang(
    parts: Parts, record: ServerRecord, requested: LeverSet
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
    checked = check_levers(requested, parts.schema, complete=True)
    check_gpu_placement(checked, len(record.managed))
    # Layouts SGLang fails building the model for (head counts vs tp, experts vs ep).
    sharding = await asyncio.to_thread(model_dir_sharding_problems, checked.levers)
    if sharding:
        raise LeverError([LeverProblem(lever, msg) for lever, msg in sharding])
    collisions = launch_topology_problems(
        checked.levers, server_port=parts.settings.server.port, api_port=parts.settings.api.port
    )
    if collisions:
        raise LeverError([LeverProblem(lever, msg) for lever, msg in collisions])
    nodes = check_node_levers(checked.levers, parts.settings.server.launcher, record.managed)
    if nodes:
        raise LeverError([LeverProblem(lever, message) for lever, message in nodes])
    detail = (
        f"schema of SGLang {parts.schema.sglang_version}: {(time.monotonic() - t0) * 1e3:.1f} ms"
    )
    if not parts.schema_live:
        paths = await _paths_here(parts, record, checked)
        return checked, f"{detail}; {paths}; SGLang's own parser and resolution not available", None
    facts = gpu_facts(parts, record.managed)
    if facts is None:
        return await _parse_only(parts, record, checked, detail)
    if not record.sglang.resolution_runs:
        return await _degraded(parts, record, checked, detail)
    try:
        verdict = await asyncio.to_thread(
            resolve_levers,
            parts.settings.server.python,
            flags(parts, checked),
            server_env(parts, record.managed, checked),
            facts,
            cwd=parts.settings.server.cwd,
            paths=path_kinds(parts.schema),
        )
    except ResolutionUnavailable as exc:
        record.sglang_learned(replace(record.sglang.degraded(str(exc)), missing=exc.missing))
        record.warn(f"validation degraded: {exc}")
        return await _degraded(parts, record, checked, detail)
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
        raise LeverError([_refusal(parts, checked, verdict)])
    return checked, detail + "; " + describe_verdict(verdict), verdict


def _refusal(parts: Parts, checked: LeverSet, verdict: Verdict) -> LeverProblem:
    message = verdict.message or "refused"
    named = refusal_levers(
        message, parts.schema, list(checked.levers), checked.levers, verdict.code_names
    )
    lever = named[0] if named else "levers"
    what = {"parse": "parser", "resolve": "launch-time resolution"}.get(
        verdict.stage or "", "launch checks"
    )
    where = f" at {verdict.where}" if verdict.where else ""
    also = f" (levers involved: {', '.join(named)})" if len(named) > 1 else ""
    return LeverProblem(
        lever,
        f"SGLang {verdict.sglang_version or parts.schema.sglang_version}'s {what} refused it"
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
    parts: Parts,
    record: ReadRecord,
    checked: LeverSet,
    detail: str,
    why: str = "the managed GPUs' compute capability is unknown",
) -> tuple[LeverSet, str, Verdict | None]:
    """Stage (b) without resolution, when the managed GPUs' facts are unknown: the
    levers' paths checked here, then SGLang's parser."""
    detail += "; " + await _paths_here(parts, record, checked)
    try:
        verdict = await asyncio.to_thread(
            check_argv, parts.settings.server.python, flags(parts, checked)
        )
    except ParserUnavailable as exc:
        problem = LeverProblem("levers", f"cannot run SGLang's parser: {exc}")
        raise LeverError([problem]) from exc
    if not verdict.ok:
        message = verdict.message or "refused"
        lever = lever_for_message(message, parts.schema, list(checked.levers))
        raise LeverError(
            [LeverProblem(lever, f"SGLang {parts.schema.sglang_version} refused it: {message}")]
        )
    return (
        checked,
        detail + f"; SGLang's parser: {verdict.duration_s:.2f} s; not run: SGLang's "
        f"resolution ({why})",
        None,
    )
