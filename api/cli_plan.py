"""``sglang-supervisor plan``: KV capacity now and with every helpful lever pulled.

Offline (no ``--url``, no ``--apply``, and ``--model`` or ``--config-json``) the plan is
computed here from the model, ``--gpus``/``--gpu-memory`` and ``--host-ram`` (default:
this host's available RAM), for SGLang's defaults at ``tp_size`` = the GPU count.
Otherwise the daemon's ``POST /plan`` computes it against the running server's levers,
GPUs, host RAM and live load; what is given here overrides those. ``--apply`` submits
the proposed levers as one apply operation (``POST /levers?wait=true``) and exits 0 only
when it succeeded.

``--url``, ``--token``/``--token-file`` and ``--json`` are the other client commands'
(``api.cli.add_client_options``). Exit status, as theirs: 0 done; 1 the daemon unreachable
or another error; 2 bad arguments, inputs that cannot be planned for, or levers refused;
3 the apply rolled back; 4 it failed; 5 another operation is running.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, TextIO

import httpx
import psutil

from api.auth import TOKEN_ENV
from api.cli import (
    EXIT_BUSY,
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    OUTCOME_EXIT,
    add_client_options,
)
from api.client import ClientError, resolve_token, resolve_url
from supervisor import planner
from supervisor.planner import Hardware, PlanError
from supervisor.units import GB, GiB

#: An apply restarts the server: model loads take minutes.
APPLY_TIMEOUT_S = 3600.0

Json = dict[str, Any]


class CliError(Exception):
    """A failure to report in one line; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.code = code


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
    p.add_argument("--avg-tokens", type=int, help="average KV tokens per request")
    p.add_argument("--target-concurrency", type=int, help="requests wanted running at once")
    p.add_argument(
        "--apply", action="store_true", help="submit the proposal to the daemon and wait"
    )
    add_client_options(p)
    return p


# --- inputs ------------------------------------------------------------------------------


def _read_model(args: argparse.Namespace) -> planner.ModelSpec | None:
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


def _check_numbers(args: argparse.Namespace) -> None:
    for name in ("gpus", "gpu_memory", "host_ram", "avg_tokens", "target_concurrency"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise CliError(
                f"--{name.replace('_', '-')} must be positive, got {value}", EXIT_INVALID
            )


def plan_offline(args: argparse.Namespace, model: planner.ModelSpec) -> Json:
    """The plan computed here, for SGLang's defaults at ``tp_size`` = ``--gpus``."""
    if args.gpus is None or args.gpu_memory is None:
        raise CliError(
            "offline planning needs --gpus and --gpu-memory (GiB per GPU); or give --url "
            "to ask the running daemon",
            EXIT_INVALID,
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
    plan = planner.propose(
        model,
        hardware,
        {"tp_size": args.gpus},
        avg_tokens=avg,
        avg_tokens_source="given" if args.avg_tokens else "assumed (pass --avg-tokens)",
        target_concurrency=args.target_concurrency,
    )
    return plan.to_json()


def _plan_body(args: argparse.Namespace, model: planner.ModelSpec | None) -> Json:
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


# --- talking to the daemon ---------------------------------------------------------------


def _client(args: argparse.Namespace, timeout_s: float) -> httpx.Client:
    """``--url`` / ``--token`` / ``--token-file`` resolved as the other client commands do."""
    url = resolve_url(args.url)
    try:
        token = resolve_token(args.token, getattr(args, "token_file", None))
    except ClientError as exc:
        raise CliError(str(exc)) from exc
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(
        base_url=url,
        headers=headers,
        timeout=httpx.Timeout(timeout_s, connect=5.0),
        trust_env=False,
    )


def _post(client: httpx.Client, path: str, body: Json) -> Json:
    """POST ``body``; the JSON answer, or ``CliError`` saying what went wrong."""
    try:
        r = client.post(path, json=body)
    except httpx.ConnectError as exc:
        raise CliError(
            f"cannot reach the daemon at {client.base_url} ({exc}); is it running? "
            "(start it with `sglang-supervisor serve`, or pass --url)"
        ) from exc
    except httpx.TimeoutException as exc:
        raise CliError(f"the daemon at {client.base_url} did not answer in time: {exc}") from exc
    except httpx.HTTPError as exc:
        raise CliError(f"talking to the daemon at {client.base_url} failed: {exc}") from exc
    try:
        data = r.json()
    except ValueError:
        data = {"detail": r.text}
    if r.status_code in (401, 403):
        raise CliError(
            f"the daemon refused the request ({r.status_code}): pass --token or --token-file, "
            f"or set ${TOKEN_ENV}"
        )
    if r.status_code == 404 and path.startswith("/plan"):
        raise CliError(f"the daemon at {client.base_url} has no POST /plan (an older version?)")
    if r.status_code == 409:
        raise CliError(f"{_detail_message(data)}", EXIT_BUSY)
    if r.status_code == 422:
        raise CliError(f"POST {path} was refused: {_detail_message(data)}", EXIT_INVALID)
    if r.status_code >= 400:
        raise CliError(f"POST {path} answered {r.status_code}: {_detail_message(data)}")
    if not isinstance(data, dict):
        raise CliError(f"POST {path} answered {r.status_code} with unexpected JSON")
    return data


def _detail_message(data: Any) -> str:
    detail = data.get("detail") if isinstance(data, dict) else data
    if isinstance(detail, dict):
        text = str(detail.get("message") or detail)
        problems = detail.get("problems")
        if isinstance(problems, list):
            text += "".join(
                f"\n  {p.get('lever')}: {p.get('message')}" for p in problems if isinstance(p, dict)
            )
        return text
    if isinstance(detail, list):
        return "; ".join(str(e.get("msg", e)) if isinstance(e, dict) else str(e) for e in detail)
    return str(detail)


# --- rendering ---------------------------------------------------------------------------


def _num(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def _size(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    return f"{n / GiB:,.1f} GiB"


def render_plan(plan: Json, out: TextIO) -> None:
    """The plan as text: context, a current-vs-proposed table, one line per lever, notes."""
    m, hw, wl = plan["model"], plan["hardware"], plan["workload"]
    cur, new = plan["current"], plan["proposed"]
    heads = (
        f"MLA, kv_lora_rank {m['kv_lora_rank']} + rope {m['qk_rope_head_dim']}"
        if m["attention"] == "MLA"
        else f"{m['attention']}, {m['num_kv_heads']} KV heads × {m['head_dim']}"
    )
    avg = wl["avg_tokens"]
    lines = [
        f"Model      {m['name']} ({m['architecture']}, {m['num_layers']} layers, {heads})",
        f"           from {m['source']}",
        f"Weights    {m['weight_bytes'] / GB:,.1f} GB ({m['weight_source']}); "
        f"{new['weight_bytes_per_rank'] / GB:,.1f} GB per rank",
        f"Hardware   {hw['gpus']} GPUs × {hw['gpu_memory_bytes'] / GiB:,.1f} GiB "
        f"({hw['gpu_source']}); host RAM {hw['host_ram_available_bytes'] / GiB:,.1f} GiB "
        f"({hw['host_ram_source']})",
        f"Workload   {avg:,} tokens per request ({wl['avg_tokens_source']})"
        + (f"; target {wl['target_concurrency']:,} at once" if wl["target_concurrency"] else ""),
        f"Diagnosis  {plan['diagnosis']}",
        "",
    ]
    delta = new["kv_tokens_per_rank"] - cur["kv_tokens_per_rank"]
    rows: list[tuple[str, str, str]] = [
        ("", "current", "proposed"),
        ("mem_fraction_static", _num(cur["mem_fraction_static"]), _num(new["mem_fraction_static"])),
        ("kv_cache_dtype", cur["kv_cache_dtype"], new["kv_cache_dtype"]),
        ("bytes per token per rank", _num(cur["cell_bytes"]), _num(new["cell_bytes"])),
        (
            "KV tokens per rank",
            _num(cur["kv_tokens_per_rank"]),
            f"{_num(new['kv_tokens_per_rank'])} ({delta:+,})",
        ),
        (
            f"concurrent requests @ {avg:,}",
            _num(cur["concurrent_requests"]),
            _num(new["concurrent_requests"]),
        ),
        (
            "host-pool tokens per rank",
            _num(cur["host_pool_tokens_per_rank"]),
            _num(new["host_pool_tokens_per_rank"]),
        ),
        (
            "host RAM needed",
            _size(cur["host_ram_needed_bytes"]),
            _size(new["host_ram_needed_bytes"]),
        ),
        (
            "max_running_requests",
            _num(cur["max_running_requests"]),
            _num(new["max_running_requests"]),
        ),
        (
            "cuda_graph_max_bs_decode",
            _num(cur["cuda_graph_max_bs_decode"]),
            _num(new["cuda_graph_max_bs_decode"]),
        ),
        (
            "chunked_prefill_size",
            _num(cur["chunked_prefill_size"]),
            _num(new["chunked_prefill_size"]),
        ),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines += [f"{a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows]
    lines.append("")
    if plan["lever_notes"]:
        lines.append("Levers")
        for note in plan["lever_notes"]:
            kept = note["lever"] in plan["levers"]
            mark = "" if kept else " (left out)"
            now = _num(note["current"])
            if note.get("current_is_default"):
                now = "SGLang's default" if note["current"] is None else f"{now}, SGLang's default"
            lines.append(
                f"  {note['lever']} = {_num(note['proposed'])} (now {now}){mark}: {note['reason']}"
            )
    else:
        lines.append("Levers     nothing to change: the current levers already pull every one")
    lines.append("Notes")
    lines += [f"  - {text}" for text in plan["notes"]]
    out.write("\n".join(lines) + "\n")


def _render_operation(op: Json, out: TextIO) -> None:
    state = op.get("state")
    out.write(f"\nApply {op.get('id')}: {state}\n")
    for ph in op.get("phases") or []:
        out.write(f"  {ph.get('name')}: {ph.get('state')} {ph.get('detail') or ''}\n")
    if op.get("error"):
        out.write(f"  error: {op['error']}\n")


# --- the command -------------------------------------------------------------------------


def run_plan(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``sglang-supervisor plan``; returns the exit status (see the module docstring)."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        _check_numbers(args)
        model = _read_model(args)
        offline = args.url is None and not args.apply and model is not None
        if offline:
            assert model is not None
            plan = plan_offline(args, model)
            if args.json:
                out.write(json.dumps(plan, indent=2) + "\n")
            else:
                render_plan(plan, out)
            return EXIT_OK
        with _client(args, 120.0) as client:
            plan = _post(client, "/plan", _plan_body(args, model))
            if not args.apply:
                if args.json:
                    out.write(json.dumps(plan, indent=2) + "\n")
                else:
                    render_plan(plan, out)
                return EXIT_OK
            if not args.json:
                render_plan(plan, out)
            if not plan.get("levers"):
                if args.json:
                    out.write(json.dumps({"plan": plan, "operation": None}, indent=2) + "\n")
                else:
                    out.write("\nNothing to apply.\n")
                return EXIT_OK
            client.timeout = httpx.Timeout(APPLY_TIMEOUT_S, connect=5.0)
            answer = _post(client, "/levers?wait=true", {"levers": plan["levers"]})
        op = answer.get("operation") or {}
        if args.json:
            out.write(json.dumps({"plan": plan, "operation": op}, indent=2) + "\n")
        else:
            _render_operation(op, out)
        state = str(op.get("state"))
        if state != "succeeded":
            err.write(
                f"sglang-supervisor plan: the apply ended {state}: "
                f"{op.get('error') or 'see the phases above'}\n"
            )
            return OUTCOME_EXIT.get(state, EXIT_FAILED)
        return EXIT_OK
    except PlanError as exc:
        err.write(f"sglang-supervisor plan: {exc}\n")
        return EXIT_INVALID
    except CliError as exc:
        err.write(f"sglang-supervisor plan: {exc}\n")
        return exc.code
