"""Text rendering for the CLI: tables, sizes, durations, phases, events. ASCII only.

Everything here is a pure function of the daemon's JSON, so it is easy to test and
never talks to the network.
"""

from __future__ import annotations

import shutil
import textwrap
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from supervisor.units import GiB

Json = dict[str, Any]


def terminal_width(default: int = 100) -> int:
    """The terminal's width (``default`` when not a terminal), at least 60."""
    return max(60, shutil.get_terminal_size((default, 24)).columns)


def clip(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with ``...`` when longer."""
    text = text.replace("\n", " ").replace("\r", " ")
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


def gib(n: int | float | None) -> str:
    """Bytes as GiB with one decimal (``-`` when unknown)."""
    return "-" if n is None else f"{n / GiB:.1f} GiB"


def duration(seconds: float | None) -> str:
    """``0.42s``, ``12.3s``, ``4m05s``, ``2h03m``, ``3d04h``."""
    if seconds is None:
        return "-"
    s = float(seconds)
    if s < 10:
        return f"{s:.2f}s"
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def value(v: Any) -> str:
    """A lever value as an operator would type it (``-`` when unset)."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return " ".join(value(x) for x in v)
    return str(v)


def clock(iso: str | None) -> str:
    """An ISO timestamp from the daemon as local ``YYYY-MM-DD HH:MM:SS``."""
    if not iso:
        return "-"
    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return iso


def epoch_clock(ts: float | None) -> str:
    """A Unix time as local ``HH:MM:SS.mmm``."""
    t = time.time() if ts is None else float(ts)
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"


def table(
    rows: Sequence[Sequence[str]], header: Sequence[str] | None = None, indent: int = 0
) -> str:
    """Left-aligned columns separated by two spaces; trailing spaces removed."""
    all_rows = [list(header)] if header else []
    all_rows += [list(r) for r in rows]
    if not all_rows:
        return ""
    ncol = max(len(r) for r in all_rows)
    for r in all_rows:
        r += [""] * (ncol - len(r))
    widths = [max(len(r[i]) for r in all_rows) for i in range(ncol)]
    pad = " " * indent
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in all_rows]
    return "\n".join(pad + line.rstrip() for line in lines)


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
        choices = choices_text(f.get("choices"), width=width - 13)
        if choices:
            out.append(f"    choices: {choices}")
        help_text = " ".join(str(f.get("help") or "").split())
        if help_text:
            out.append(
                textwrap.fill(help_text, width, initial_indent="    ", subsequent_indent="    ")
            )
    return "\n".join(out)


# ------------------------------------------------------------- operations


def _stamp(elapsed_s: float) -> str:
    """``  +1.23s``: time since the operation was submitted, right-aligned."""
    return f"+{elapsed_s:.2f}s".rjust(8)


def phase_line(phase: Mapping[str, Any], elapsed_s: float, *, started: bool = False) -> str:
    """One line per phase start (``started``) or end: elapsed, name, state, time, detail."""
    name = str(phase.get("name"))
    stamp = _stamp(elapsed_s)
    if started:
        return f"  {stamp}  {name:<17} started"
    state = str(phase.get("state"))
    took = duration(phase.get("duration_s"))
    detail = str(phase.get("detail") or "")
    line = f"  {stamp}  {name:<17} {state:<10} {took:>7}"
    return f"{line}  {detail}" if detail else line


def memory_line(gpus: Sequence[Mapping[str, Any]], elapsed_s: float) -> str:
    """Per-GPU memory in use during release: ``0:117.3 1:117.3 ... GiB``."""
    parts = " ".join(
        f"{g.get('index')}:{int(g.get('memory_used_bytes') or 0) / GiB:.1f}" for g in gpus
    )
    return f"  {_stamp(elapsed_s)}    gpu memory used (GiB)  {parts}"


def log_line(line: str, width: int) -> str:
    """A server log line, indented under the phase it belongs to."""
    return clip("      | " + line, width)


# ----------------------------------------------------------------- events


def _kv(event: Mapping[str, Any], skip: set[str]) -> str:
    parts = []
    for k, v in event.items():
        if k in skip:
            continue
        if isinstance(v, (dict, list)):
            continue
        if isinstance(v, float):
            v = round(v, 3)
        parts.append(f"{k}={value(v)}")
    return " ".join(parts)


def render_event(event: Mapping[str, Any], width: int | None = None) -> str:
    """One line per event of ``GET /events``."""
    kind = str(event.get("kind"))
    stamp = epoch_clock(event.get("time"))
    base = {"seq", "time", "kind"}
    if kind == "transition":
        body = f"{event.get('old')} -> {event.get('new')} ({event.get('reason')})"
    elif kind == "phase":
        body = f"{event.get('operation')} {event.get('op_kind')} {event.get('name')} "
        if event.get("state") == "running":
            body += "started"
        else:
            body += f"{event.get('state')} {duration(event.get('duration_s'))}"
            if event.get("detail"):
                body += f": {event['detail']}"
    elif kind == "operation":
        body = f"{event.get('id')} {event.get('op_kind')} {event.get('state')}"
    elif kind == "release_sample":
        gpus = event.get("gpus") or []
        body = f"{event.get('operation')} GiB used " + " ".join(
            f"{g.get('index')}:{int(g.get('memory_used_bytes') or 0) / GiB:.1f}" for g in gpus
        )
    else:
        body = _kv(event, base)
    line = f"{stamp}  {kind:<15} {body}"
    return clip(line, width) if width else line
