"""The CLI's views of the daemon's JSON: status, levers, the lever schema. ASCII only.

Everything here is a pure function of the daemon's JSON, so it is easy to test and
never talks to the network.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sglang_supervisor_api.cli.render_effect import effect_summary
from sglang_supervisor_api.cli.text import clip, clock, duration, gib, table, terminal_width, value

Json = dict[str, Any]


# ----------------------------------------------------------------- levers


def lever_rows(
    current: Mapping[str, Any],
    current_env: Mapping[str, Any],
    good: Mapping[str, Any] | None,
) -> list[tuple[str, Any, Any, bool]]:
    """``(name, current, last_good, differs)`` for every lever and env var of either set.

    ``good`` is the ``{levers, env}`` of the last-good set, or None when there is none.
    """
    good_levers: Mapping[str, Any] = (good or {}).get("levers") or {}
    good_env: Mapping[str, Any] = (good or {}).get("env") or {}
    rows: list[tuple[str, Any, Any, bool]] = []
    for prefix, cur, old in (("", current, good_levers), ("env.", current_env, good_env)):
        for key in sorted(set(cur) | set(old)):
            a, b = cur.get(key), old.get(key)
            rows.append((prefix + key, a, b, good is not None and a != b))
    return rows


def render_levers(data: Json) -> str:
    """``GET /levers`` as a table: current beside last-good, differences marked ``*``."""
    good = data.get("last_good")
    rows = lever_rows(data.get("levers") or {}, data.get("env") or {}, good)
    if not rows:
        return "no levers set (SGLang's defaults)"
    body = table(
        [(name, value(a), value(b), "*" if d else "") for name, a, b, d in rows],
        header=("LEVER", "CURRENT", "LAST-GOOD", ""),
    )
    if good is None:
        return body + "\n\nno last-good levers yet (no launch has been proven ready)"
    if any(d for *_, d in rows):
        return body + "\n\n* differs from the last-good set"
    return body


def lever_changes(before: Json, after: Json) -> list[str]:
    """``name old -> new`` for every lever and env var that differs between two
    ``{levers, env}`` mappings."""
    out = []
    for prefix, key in (("", "levers"), ("env.", "env")):
        a: Mapping[str, Any] = before.get(key) or {}
        b: Mapping[str, Any] = after.get(key) or {}
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                out.append(f"{prefix}{k} {value(a.get(k))} -> {value(b.get(k))}")
    return out


# ----------------------------------------------------------------- status


def _throughput(t: Mapping[str, Any] | None) -> str:
    if not t or t.get("source") is None:
        return "no data yet"
    parts = []
    if t.get("gen_tokens_per_s") is not None:
        parts.append(f"{t['gen_tokens_per_s']:.1f} gen tok/s")
    if t.get("running_requests") is not None:
        parts.append(f"{t['running_requests']:.0f} running")
    if t.get("queued_requests") is not None:
        parts.append(f"{t['queued_requests']:.0f} queued")
    if t.get("token_usage") is not None:
        parts.append(f"KV usage {t['token_usage'] * 100:.0f}%")
    if t.get("cache_hit_rate") is not None:
        parts.append(f"cache hit {t['cache_hit_rate'] * 100:.0f}%")
    return ", ".join(parts) + f" (from the server's {t['source']})"


def running_operation(op: Mapping[str, Any]) -> str:
    """``apply 1a2b3c running, phase release (1.20s)``."""
    phases = op.get("phases") or []
    text = f"{op.get('kind')} {op.get('id')} {op.get('state')}"
    if phases:
        last = phases[-1]
        took = last.get("duration_s")
        if took is None:
            took = since(last.get("started_at"))
        text += f", phase {last.get('name')} {last.get('state')}"
        if took is not None:
            text += f" ({duration(took)})"
    return text


def since(iso: str | None) -> float | None:
    """Seconds from an ISO timestamp of the daemon until now (None when unreadable)."""
    if not iso:
        return None
    try:
        then = datetime.fromisoformat(iso)
    except ValueError:
        return None
    if then.tzinfo is None:
        return None
    return max(0.0, (datetime.now(UTC) - then).total_seconds())


def _gpu_rows(gpus: Sequence[Mapping[str, Any]]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for g in gpus:
        if "error" in g:
            rows.append((str(g.get("index")), "query failed", "", "", "", "", str(g["error"])))
            continue
        used, total = g.get("memory_used_bytes"), g.get("memory_total_bytes")
        pct = f"{used / total * 100:.0f}%" if used is not None and total else "-"
        procs = g.get("processes") or []
        members = sum(1 for p in procs if p.get("member"))
        foreign = len(procs) - members
        rows.append(
            (
                str(g.get("index")),
                gib(used),
                gib(total),
                pct,
                str(members),
                str(foreign) if foreign else "0",
                str(g.get("name") or ""),
            )
        )
    return rows


def render_status(s: Json) -> str:
    """``GET /status`` for a human: state, server, operation, levers, GPUs, load."""
    lines: list[str] = []
    state = f"{s.get('state')}"
    if s.get("state_for_s") is not None:
        state += f" for {duration(s['state_for_s'])}"
    if s.get("state_reason"):
        state += f" ({s['state_reason']})"
    head: list[tuple[str, str]] = [("state", state)]
    backend = str(s.get("backend"))
    probe = s.get("gpu_probe") or {}
    if probe.get("kind"):
        backend += f", GPU probe {probe['kind']}"
    schema = s.get("schema") or {}
    if schema.get("sglang_version"):
        backend += f", SGLang {schema['sglang_version']} ({schema.get('source')} schema)"
    head.append(("backend", backend))
    srv = s.get("server")
    if srv:
        head.append(("server", f"pid {srv.get('pid')}  {srv.get('url')}"))
        tokens = srv.get("max_total_num_tokens")
        head.append(
            (
                "",
                f"started {clock(srv.get('started_at'))}, ready {clock(srv.get('ready_at'))}, "
                f"max_total_num_tokens {'-' if tokens is None else f'{tokens:,}'}",
            )
        )
    else:
        head.append(("server", "none"))
    op = s.get("operation")
    head.append(("operation", running_operation(op) if op else "none running"))
    restarts = f"{s.get('restarts', 0)}"
    by_reason = s.get("restarts_by_reason") or {}
    if by_reason:
        restarts += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(by_reason.items())) + ")"
    head.append(("restarts", restarts))
    head.append(("throughput", _throughput(s.get("throughput"))))
    cache = s.get("sglang_cache") or {}
    if cache.get("path"):
        size = cache.get("bytes")
        held = "not measured yet" if size is None else f"{gib(size)}, {cache.get('files')} files"
        if size is not None and cache.get("complete") is False:
            held = "at least " + held
        head.append(("jit cache", f"{cache['path']} ({cache.get('error') or held})"))
    effect = s.get("effect")
    if isinstance(effect, dict):
        head.append(("effect", f"apply {effect.get('operation')}: {effect_summary(effect)}"))
    lines.append(table(head))

    rows = lever_rows(s.get("levers") or {}, s.get("env") or {}, s.get("last_good_levers"))
    lines.append("")
    if rows:
        lines.append("levers")
        lever_table = []
        for name, cur, old, differs in rows:
            note = f"(last-good: {value(old)})" if differs else ""
            lever_table.append((name, value(cur), note))
        lines.append(table(lever_table, indent=2))
    else:
        lines.append("levers: none set (SGLang's defaults)")
    if s.get("last_good_levers") is None:
        lines.append("  no last-good levers yet")
    # Where the config file's levers differ (`sglang-supervisor reconcile` applies them).
    drift = [
        (str(d.get("lever")), value(d.get("config")), value(d.get("serving")))
        for d in s.get("drift") or []
    ]
    if drift:
        lines += [
            "",
            "drift from the config (reconcile applies it)",
            table(drift, header=("LEVER", "CONFIG", "SERVING"), indent=2),
        ]

    gpus = s.get("gpus") or []
    if gpus:
        lines.append("")
        lines.append(
            table(
                _gpu_rows(gpus),
                header=("GPU", "USED", "TOTAL", "USE", "MEMBERS", "FOREIGN", "NAME"),
            )
        )
    warnings = s.get("warnings") or []
    if warnings:
        lines.append("")
        lines.append("warnings")
        width = terminal_width()
        for w in warnings:
            lines.append(
                textwrap.fill(str(w), width, initial_indent="  - ", subsequent_indent="    ")
            )
    return "\n".join(lines)


# ----------------------------------------------------------------- schema


def _flag_type(flag: Mapping[str, Any]) -> str:
    boolean = flag.get("boolean")
    if boolean:
        return {"store_true": "bool flag", "store_false": "bool flag (inverted)"}.get(
            boolean, "bool"
        )
    t = str(flag.get("type") or "str")
    if t.startswith("callable:"):
        t = t.split(":", 1)[1]
    nargs = flag.get("nargs")
    if nargs in ("+", "*") or (isinstance(nargs, int) and nargs > 1):
        t = f"list of {t}"
    return t


def choices_text(choices: Sequence[Any] | None, limit: int = 8, width: int = 90) -> str:
    """``a, b, c, ... (+12 more)``; empty when there are no choices."""
    if not choices:
        return ""
    shown = [value(c) for c in choices[:limit]]
    text = ", ".join(shown)
    more = len(choices) - len(shown)
    if more > 0:
        text += f", ... (+{more} more)"
    return clip(text, width)


def render_schema(data: Json, word: str | None) -> str:
    """``GET /levers/schema`` as one block per flag: dest, option, type, default, choices,
    and the help wrapped to the terminal."""
    width = terminal_width()
    flags = data.get("flags") or []
    source = data.get("source")
    what = f"matching {word!r}" if word else "in all"
    head = (
        f"SGLang {data.get('sglang_version')} ({source} schema"
        f"{', checked by its own parser too' if data.get('live') else ''}): "
        f"{len(flags)} flag{'s' if len(flags) != 1 else ''} {what}"
    )
    out = [head]
    for f in flags:
        out.append("")
        opts = [o for o in f.get("option_strings") or [] if o.startswith("--")]
        option = opts[0] if opts else (f.get("option_strings") or ["?"])[0]
        line = f"{f.get('dest')}  {option}  {_flag_type(f)}  default: {value(f.get('default'))}"
        if f.get("deprecated"):
            line += "  (deprecated)"
        out.append(line)
        if f.get("live_via"):
            out.append(f"    changed live (no restart): {f['live_via']}")
        choices = choices_text(f.get("choices"), width=width - 13)
        if choices:
            out.append(f"    choices: {choices}")
        help_text = " ".join(str(f.get("help") or "").split())
        if help_text:
            out.append(
                textwrap.fill(help_text, width, initial_indent="    ", subsequent_indent="    ")
            )
    return "\n".join(out)
