"""``sglang-supervisor plan`` as text: the context, current beside proposed, the levers."""

from __future__ import annotations

from typing import Any

from sglang_supervisor.units import GB, GiB, MiB

Json = dict[str, Any]


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


def _either(cur: Json, new: Json, key: str) -> bool:
    return bool(cur.get(key)) or bool(new.get(key))


def _pool_rows(cur: Json, new: Json) -> list[tuple[str, str, str]]:
    """The sliding-window and Mamba/linear-attention pools, when the model has them."""
    rows: list[tuple[str, str, str]] = []
    if _either(cur, new, "swa_tokens_per_rank"):
        rows.append(
            (
                "sliding-window tokens per rank",
                _num(cur.get("swa_tokens_per_rank")),
                _num(new.get("swa_tokens_per_rank")),
            )
        )
    if _either(cur, new, "mamba_slots_per_rank"):
        rows.append(
            (
                "Mamba state slots per worker",
                _num(cur.get("mamba_slots_per_rank")),
                _num(new.get("mamba_slots_per_rank")),
            )
        )
        rows.append(
            (
                "Mamba state per slot",
                f"{(cur.get('mamba_state_bytes') or 0) / MiB:,.1f} MiB",
                f"{(new.get('mamba_state_bytes') or 0) / MiB:,.1f} MiB",
            )
        )
        rows.append(
            (
                "request cap of the slots",
                _num(cur.get("mamba_request_cap")),
                _num(new.get("mamba_request_cap")),
            )
        )
    return rows


def _worker_rows(cur: Json, new: Json) -> list[tuple[str, str, str]]:
    """Attention DP / DP replicas: one KV pool and scheduler per worker."""
    if max(cur.get("kv_pools") or 1, new.get("kv_pools") or 1) <= 1:
        return []
    return [
        ("attn_dp_size", _num(cur.get("attn_dp_size")), _num(new.get("attn_dp_size"))),
        ("KV pools (DP workers)", _num(cur.get("kv_pools")), _num(new.get("kv_pools"))),
        (
            "max_running_requests per worker",
            _num(cur.get("max_running_requests_per_worker")),
            _num(new.get("max_running_requests_per_worker")),
        ),
    ]


def render_plan(plan: Json) -> str:
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
        *_node_lines(plan.get("nodes")),
        f"Workload   {avg:,} tokens per request ({wl['avg_tokens_source']})"
        + (f"; target {wl['target_concurrency']:,} at once" if wl["target_concurrency"] else ""),
        f"Diagnosis  {plan['diagnosis']}",
        *_downtime_lines(plan.get("expected_downtime")),
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
        *_pool_rows(cur, new),
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
            "host RAM needed" + (" per node" if new.get("nnodes", 1) > 1 else ""),
            _size(cur.get("host_ram_needed_bytes_per_node", cur["host_ram_needed_bytes"])),
            _size(new.get("host_ram_needed_bytes_per_node", new["host_ram_needed_bytes"])),
        ),
        (
            "max_running_requests",
            _num(cur["max_running_requests"]),
            _num(new["max_running_requests"]),
        ),
        *_worker_rows(cur, new),
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
            lines += _effect_lines(note)
    else:
        lines.append("Levers     nothing to change: the current levers already pull every one")
    lines.append("Notes")
    lines += [f"  - {text}" for text in plan["notes"]]
    return "\n".join(lines)


def _downtime_lines(down: Any) -> list[str]:
    """The change's expected time without service (``planner.downtime``), and what comes
    before and after it."""
    if not isinstance(down, dict):
        return []
    parts = {p["name"]: p for p in down.get("parts") or []}
    around = [
        f"{name} {parts[name]['seconds']:g} s"
        for name in ("drain", "probation")
        if name in parts and not parts[name]["without_service"] and parts[name]["seconds"]
    ]
    tail = f"; the server serves during the {' and '.join(around)}" if around else ""
    return [f"Expected   {down['summary']}: stop -> the new server's ready{tail}"]


def _effect_lines(note: Json) -> list[str]:
    """A lever's effect in the bottleneck's unit and its cost in seconds, when known."""
    out = []
    effect, cost = note.get("effect"), note.get("cost")
    if isinstance(effect, dict):
        now, new = effect.get("now"), effect.get("expected")
        figures = f" {_num(now)} -> {_num(new)}" if new is not None else f" now {_num(now)}"
        out.append(f"      effect: {effect['unit']}{figures} ({effect['text']})")
    if isinstance(cost, dict) and (cost.get("start_s") != 0 or cost.get("stop_s") != 0):
        start, stop = cost.get("start_s"), cost.get("stop_s")
        start_text = "start not timed" if start is None else f"start {start:+g} s"
        stop_text = "stop not timed" if stop is None else f"stop {stop:+g} s"
        out.append(f"      cost: {start_text}, {stop_text} ({cost['basis']})")
    return out


def _node_lines(nodes: Any) -> list[str]:
    """The node line of a server spanning nodes (none on one host, or from a daemon
    whose plan has no ``nodes``)."""
    if not isinstance(nodes, dict) or (nodes.get("nnodes") or 1) <= 1:
        return []
    return [
        f"Nodes      {nodes['nnodes']} nodes × {nodes['gpus_per_node']} GPUs "
        f"({nodes['gpu_memory_bytes_per_node'] / GiB:,.0f} GiB GPU memory per node); "
        f"{nodes['ranks_per_node']} of the {nodes['ranks']} ranks on each node; "
        "GPUs and host RAM above are one node's"
    ]


def render_apply(op: Json) -> str:
    """How the plan's apply ended: its state, each phase, the error."""
    lines = [f"Apply {op.get('id')}: {op.get('state')}"]
    for ph in op.get("phases") or []:
        lines.append(f"  {ph.get('name')}: {ph.get('state')} {ph.get('detail') or ''}".rstrip())
    if op.get("error"):
        lines.append(f"  error: {op['error']}")
    line = downtime_line(op)
    if line:
        lines.append(f"  {line}")
    return "\n".join(lines)


def downtime_line(op: Json) -> str | None:
    """An operation's time without service: what it expected, what it measured."""
    expected, measured = op.get("expected_downtime"), op.get("downtime")
    if not isinstance(expected, dict) and not isinstance(measured, dict):
        return None
    said = []
    if isinstance(measured, dict):
        span = (
            "stop -> ready" if measured.get("serving_again") else "stop -> its end: nothing serves"
        )
        said.append(f"{measured['seconds']:.1f} s measured ({span})")
    if isinstance(expected, dict):
        said.append(f"expected {expected['summary']}")
    return "without service: " + "; ".join(said)
