"""The server we call ready must be ours: the server port is free before every launch
(start, recovery, rollback, apply, the daemon's start-up: all go through
``launch_until_ready``), and a /health_generate 200 counts only when the process
listening on the port is a member of this launch (``ProcessOps.members``).

Without these, a second daemon (or any process) on the server port answered the probes
for a launch whose own bind had failed: ``ready`` within a second, then a crash loop whose
every recovery was logged ``succeeded``.
"""

from __future__ import annotations

import asyncio

from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ServerRecord
from sglang_supervisor.host.backend import ServerHandle
from sglang_supervisor.host.ports import PortsUnreadable, describe_pid


def _holders_text(holders: list[int | None], port: int) -> str:
    return ", ".join(describe_pid(pid, port) for pid in holders)


async def port_taken(parts: Parts, record: ServerRecord) -> str | None:
    """Why the server port cannot take a new launch now (None: nothing listens on it).
    Called after the old server was torn down, so any listener is not ours."""
    s = parts.settings.server
    try:
        holders = await asyncio.to_thread(parts.procs.port_listeners, s.host, s.port)
    except PortsUnreadable as exc:
        record.warn(f"the server port's owner cannot be checked before a launch: {exc}")
        return None
    if not holders:
        return None
    return (
        f"not starting: server port {s.host}:{s.port} is held by "
        f"{_holders_text(holders, s.port)}, not by a server of this daemon; its "
        "/health_generate would be taken for ours. Stop that process or set server.port "
        "to a free port"
    )


async def foreign_listener(parts: Parts, record: ServerRecord, handle: ServerHandle) -> str | None:
    """None when the process listening on the server port is a member of ``handle``'s
    launch; else who listens there (``[]``: nobody visible yet). Blocking scans run in
    a worker thread."""
    s = parts.settings.server
    try:
        holders = await asyncio.to_thread(parts.procs.port_listeners, s.host, s.port)
    except PortsUnreadable as exc:
        # Cannot tell: say so once rather than never call anything ready.
        record.warn(f"readiness is not checked against the port's owner: {exc}")
        return None
    members = await asyncio.to_thread(parts.procs.members, handle, tag=handle.tag, tag_prefix=None)
    if any(pid is not None and pid in members for pid in holders):
        return None
    if not holders:
        return f"nothing this daemon can see listens on {s.host}:{s.port}"
    return (
        f"server port {s.host}:{s.port} is held by {_holders_text(holders, s.port)}, "
        f"which is not part of this launch (pid {handle.pid})"
    )
