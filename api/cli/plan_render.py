"""``sglang-supervisor plan`` as text: the context, current beside proposed, the levers."""

from __future__ import annotations

from typing import Any

from supervisor.units import GB, GiB

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
    return "\n".join(lines)


def render_apply(op: Json) -> str:
    """How the plan's apply ended: its state, each phase, the error."""
    lines = [f"Apply {op.get('id')}: {op.get('state')}"]
    for ph in op.get("phases") or []:
        lines.append(f"  {ph.get('name')}: {ph.get('state')} {ph.get('detail') or ''}".rstrip())
    if op.get("error"):
        lines.append(f"  error: {op['error']}")
    return "\n".join(lines)
