"""Lines printed while something happens: an operation's phases, per-GPU memory during a
release, the server's log during a start, the daemon's events. Pure functions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sglang_supervisor.units import GiB
from sglang_supervisor_api.cli.text import clip, duration, epoch_clock, value


def _stamp(elapsed_s: float) -> str:
    """``  +1.23s``: time since the operation started (its ``created_at``), right-aligned."""
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
