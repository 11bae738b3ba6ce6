"""``sglang-supervisor plan``: KV capacity now and with every helpful lever pulled.

Offline (no ``--url``, no ``--apply``, and ``--model``, ``--config-json`` or a local
``model_path`` lever) the plan is computed here from the model, ``--gpus``/``--gpu-memory``
and ``--host-ram`` (default: this host's available RAM), for the lever set given as
``apply`` takes it (``--file`` levers.toml, then ``--set LEVER=VALUE``; checked against the
bundled schema) on SGLang's defaults at ``tp_size`` = the GPU count; with ``--nnodes N``
the GPUs and host RAM are one node's and ``tp_size`` = GPUs × N over N nodes.
Otherwise the daemon's ``POST /plan`` computes it against the running server's levers,
GPUs, host RAM and live load; what is given here overrides those. ``--apply`` submits
the proposed levers as one apply operation (``POST /levers?wait=true``) and exits 0 only
when it succeeded.

``--url``, ``--token``/``--token-file`` and ``--json`` are the other client commands'
(``sglang_supervisor_api.cli.options``), and so are the client, its errors and their exit codes
(``sglang_supervisor_api.cli.runner``): 0 done; 1 the daemon unreachable or another error; 2 bad
arguments, inputs that cannot be planned for, or levers refused; 3 the apply rolled back; 4 it
failed; 5 another operation is running.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sglang_supervisor_api.cli.client import Client
from sglang_supervisor_api.cli.exits import EXIT_INVALID, EXIT_OK, UsageError, outcome_exit
from sglang_supervisor_api.cli.levers_input import lever_changes_from_args
from sglang_supervisor_api.cli.options import add_client_options
from sglang_supervisor_api.cli.output import err, out, print_json, show
from sglang_supervisor_api.cli.plan_render import render_apply, render_plan
from sglang_supervisor_api.cli.runner import run_client_command

if TYPE_CHECKING:
    from sglang_supervisor.planner import ModelSpec

# The planner (and psutil) are imported when planning, not for every command's parser.

Json = dict[str, Any]


def add_plan_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``plan`` on ``sglang-supervisor``'s subparsers; returns its parser."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="propose levers for more KV capacity (offline, or from the running daemon)",
        description=(
            "Compute KV-cache capacity (tokens per rank, concurrent requests, host-pool "
            "tokens) for the current levers and for a proposal that pulls every lever that "
            "helps: mem_fraction_static, fp8 KV cache, hierarchical cache, "
            "max_running_requests, cuda_graph_max_bs_decode, chunked_prefill_size."
        ),
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", type=Path, help="a local model directory (config.json, weights)")
    src.add_argument("--config-json", type=Path, help="a model's config.json")
    p.add_argument("--gpus", type=int, help="GPU count (default: the daemon's managed GPUs)")
    p.add_argument("--gpu-memory", type=float, metavar="GiB", help="memory per GPU, GiB")
    p.add_argument("--host-ram", type=float, metavar="GiB", help="available host RAM, GiB")
    p.add_argument(
        "--nnodes",
        type=int,
        metavar="N",
        help="offline: a server spanning N nodes (--gpus and --host-ram are one node's)",
    )
    p.add_argument(
        "--set",
        dest="set_",
        action="append",
        default=[],
        metavar="LEVER=VALUE",
        help="offline: a lever of the set to plan, as apply takes it (VALUE reads like TOML)",
    )
    p.add_argument(
        "--file",
        type=Path,
        help="offline: a TOML file with [levers] (and [env]) as apply takes it (--set wins)",
    )
    p.add_argument("--avg-tokens", type=int, help="average KV tokens per request")
    p.add_argument("--target-concurrency", type=int, help="requests wanted running at once")
    p.add_argument(
        "--apply", action="store_true", help="submit the proposal to the daemon and wait"
    )
    add_client_options(p)
    return p


# --- inputs ------------------------------------------------------------------------------


def _read_model(args: argparse.Namespace) -> ModelSpec | None:
    from sglang_supervisor import planner

    if args.model is not None:
        return planner.load_model_dir(args.model.expanduser())
    if args.config_json is not None:
        path: Path = args.config_json.expanduser()
        found = planner.weight_bytes_from_dir(path.parent)
        weights, how = found if found is not None else (None, None)
        return planner.model_from_config(
            planner.read_config(path),
            name=path.parent.name or path.name,
            source=str(path),
            weight_bytes=weights,
            weight_source=how,
        )
    return None


def _lever_set(args: argparse.Namespace) -> tuple[Json, Json]:
    """The levers of ``--file`` and ``--set``, read as ``apply`` reads them and checked
    against the bundled schema (``UsageError`` naming each bad lever)."""
    from types import SimpleNamespace

    from sglang_supervisor.sglang.levers import LeverError, LeverSet, check_levers
    from sglang_supervisor.sglang.schema import load_bundled

    given = SimpleNamespace(file=args.file, set_=args.set_, env=[], unset=[])
    levers, env = lever_changes_from_args(given)  # type: ignore[arg-type]
    try:
        checked = check_levers(LeverSet(levers, env), load_bundled())
    except LeverError as exc:
        raise UsageError(
            "the levers to plan are refused: "
            + "; ".join(f"{p.lever}: {p.message}" for p in exc.problems)
        ) from exc
    return dict(checked.levers), dict(checked.env)


def _model_of_levers(levers: Json) -> ModelSpec | None:
    """The model a ``model_path`` lever names, when it is a local model directory."""
    from sglang_supervisor import planner

    path = levers.get("model_path")
    if not isinstance(path, str) or not path:
        return None
    local = Path(path).expanduser()
    if not (local / "config.json").is_file():
        raise UsageError(
            f"model_path {path!r} is not a local model directory with a config.json: give "
            "--model DIR or --config-json FILE to plan offline"
        )
    return planner.load_model_dir(local)


def _check_numbers(args: argparse.Namespace) -> None:
    for name in ("gpus", "gpu_memory", "host_ram", "nnodes", "avg_tokens", "target_concurrency"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {value}")


def plan_offline(args: argparse.Namespace, model: ModelSpec) -> Json:
    import psutil

    from sglang_supervisor import planner
    from sglang_supervisor.planner import Hardware
    from sglang_supervisor.units import GiB

    """The plan computed here, for SGLang's defaults at ``tp_size`` = ``--gpus``."""
    if args.gpus is None or args.gpu_memory is None:
        raise UsageError(
            "offline planning needs --gpus and --gpu-memory (GiB per GPU); or give --url "
            "to ask the running daemon"
        )
    if args.host_ram is not None:
        ram, ram_source = int(args.host_ram * GiB), "given"
    else:
        ram, ram_source = int(psutil.virtual_memory().available), "this host's available RAM"
    hardware = Hardware(
        gpus=args.gpus,
        gpu_memory_bytes=int(args.gpu_memory * GiB),
        host_ram_available_bytes=ram,
        gpu_source="given",
        host_ram_source=ram_source,
    )
    avg = args.avg_tokens or planner.DEFAULT_AVG_TOKENS
    levers, env = _lever_set(args)
    nnodes = args.nnodes or int(levers.get("nnodes") or 1)
    # SGLang's tp_size is the whole server's: every GPU of every node (tp×pp/nnodes per node).
    current: Json = {"tp_size": args.gpus * nnodes}
    if nnodes > 1:
        current["nnodes"] = nnodes
    current.update(levers)  # the set given, as apply takes it
    plan = planner.propose(
        model,
        hardware,
        current,
        avg_tokens=avg,
        avg_tokens_source="given" if args.avg_tokens else "assumed (pass --avg-tokens)",
        target_concurrency=args.target_concurrency,
    )
    out = plan.to_json()
    if env:
        out["notes"].append(
            f"The server environment given ({', '.join(sorted(env))}) is not planned for: "
            "the figures are SGLang's defaults for it"
        )
    return out


def _plan_body(args: argparse.Namespace, model: ModelSpec | None) -> Json:
    from sglang_supervisor import planner

    body: Json = {}
    if model is not None:
        # Read here and sent inline: the daemon may not see this host's files.
        path = args.model or args.config_json
        body["config_json"] = planner.read_config(
            path / "config.json" if args.model is not None else path
        )
        body["weight_bytes"] = model.weight_bytes
        body["weight_source"] = model.weight_source
        body["name"] = model.name
    for key, arg in (
        ("gpus", "gpus"),
        ("gpu_memory_gib", "gpu_memory"),
        ("host_ram_gib", "host_ram"),
        ("avg_tokens", "avg_tokens"),
        ("target_concurrency", "target_concurrency"),
    ):
        value = getattr(args, arg)
        if value is not None:
            body[key] = value
    return body


def run_plan(args: argparse.Namespace) -> int:
    """Run ``sglang-supervisor plan``; returns the exit status (see the module docstring)."""
    from sglang_supervisor.planner import PlanError

    try:
        _check_numbers(args)
        model = _read_model(args)
        offline = args.url is None and not args.apply
        if offline and model is None and (args.set_ or args.file is not None):
            model = _model_of_levers(_lever_set(args)[0])
        if offline and model is not None:
            plan = plan_offline(args, model)
            show(plan, render_plan, as_json=args.json)
            return EXIT_OK
        if args.set_ or args.file is not None:
            raise UsageError(
                "--set and --file plan a lever set offline (with --model, --config-json or a "
                "local model_path, no --url or --apply); the daemon plans for its current "
                "levers: apply them first"
            )
        if args.nnodes is not None:
            raise UsageError(
                "--nnodes is for offline planning (--model or --config-json, no --url or "
                "--apply); the daemon plans for its own nnodes lever and its nodes' GPUs"
            )
    except (UsageError, PlanError) as exc:
        err(str(exc))
        return EXIT_INVALID
    return run_client_command(args, lambda a, client: _plan_with_daemon(a, client, model))


def _plan_with_daemon(args: argparse.Namespace, client: Client, model: ModelSpec | None) -> int:
    """The daemon's plan (``POST /plan``); with ``--apply`` its levers applied, waiting."""
    from sglang_supervisor.planner import PlanError

    try:
        body = _plan_body(args, model)
    except PlanError as exc:
        raise UsageError(str(exc)) from exc
    plan = client.plan(body)
    if not args.apply:
        show(plan, render_plan, as_json=args.json)
        return EXIT_OK
    if not args.json:
        out(render_plan(plan))
    if not plan.get("levers"):
        if args.json:
            print_json({"plan": plan, "operation": None})
        else:
            out()
            out("Nothing to apply.")
        return EXIT_OK
    apply = plan.get("apply")
    request = apply.get("body") if isinstance(apply, dict) else None
    op = client.apply_body(request or {"levers": plan["levers"]}, wait=True)
    if args.json:
        print_json({"plan": plan, "operation": op})
    else:
        out()
        out(render_apply(op))
    state = str(op.get("state"))
    if state != "succeeded":
        err(f"the plan's apply ended {state}: {op.get('error') or 'see the phases above'}")
    return outcome_exit(state)
