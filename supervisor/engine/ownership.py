"""The server we call ready must be ours: the server port is free before every launch
(start, recovery, rollback, apply, the daemon's start-up: all go through
``launch_until_ready``), and a /health_generate 200 counts only when the process
listening on the port is a member of this launch (``ProcessOps.members``).

Without these, a second daemon (or any process) on the server port answered the probes
for a launch whose own bind had failed: ``ready`` within a second, then a crash loop whose
every recovery was logged ``succeeded``.

The verdict is one consistent look (``judge_listeners``, in one worker thread): the
socket table and the launch's members are two scans of a moving process table, so a
process that exits between them (a launch whose server crashed just after answering, on
a loaded host) would be a listener without being a member. A listener is called foreign
only when a second look still finds it listening and still finds it no member; the launch
itself is never foreign, nor is a listener that has exited. Before a launch, likewise, a
holder is named only when the second scan still finds it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.engine.record import ServerRecord
from sglang_supervisor.host.backend import ProcessOps, ServerHandle
from sglang_supervisor.host.ports import PortsUnreadable, describe_pid


@dataclass(frozen=True)
class Listeners:
    """Who listens on the server port, judged for one launch (``judge_listeners``)."""

    #: A member of the launch (or the launch itself) listens: the 200 was ours.
    ours: bool
    #: Who listens at the second look, none a member of the launch (``None``: one this
    #: daemon cannot see); empty when nothing listens any more (the one that answered has
    #: exited).
    foreign: tuple[int | None, ...] = ()

    def describe(self, host: str, port: int, launch_pid: int) -> str:
        """What an operator reads: who holds ``host:port`` instead of the launch."""
        if not self.foreign:
            return (
                f"nothing listens on {host}:{port} any more (the process that answered has exited)"
            )
        return (
            f"server port {host}:{port} is held by {_holders_text(self.foreign, port)}, "
            f"which is not part of this launch (pid {launch_pid})"
        )


def _holders_text(holders: tuple[int | None, ...] | list[int | None], port: int) -> str:
    return ", ".join(describe_pid(pid, port) for pid in holders)


def held_still(procs: ProcessOps, host: str, port: int) -> list[int | None]:
    """The port's listeners seen in two scans in a row (a holder that exits between them
    was leaving: the port is free for a launch). Blocking; raises ``PortsUnreadable``."""
    first = procs.port_listeners(host, port)
    if not first:
        return []
    return [pid for pid in procs.port_listeners(host, port) if pid in first]


def judge_listeners(procs: ProcessOps, handle: ServerHandle, host: str, port: int) -> Listeners:
    """Whether the listener on ``host:port`` is ``handle``'s launch (the launcher itself
    or one of its members), in two looks at most: when the first finds only listeners
    that are no member, the second judges again — whoever still listens and is still no
    member is foreign; nobody left, the one that answered has exited. Blocking (run it
    in a worker thread); raises ``PortsUnreadable``."""
    verdict = _look(procs, handle, host, port)
    if isinstance(verdict, Listeners):
        return verdict
    again = _look(procs, handle, host, port)
    return again if isinstance(again, Listeners) else Listeners(ours=False, foreign=again)


def _look(
    procs: ProcessOps, handle: ServerHandle, host: str, port: int
) -> Listeners | tuple[int | None, ...]:
    """One look: a verdict, or the listeners that are no member of the launch (all of
    them: any member among them makes it ``ours``)."""
    listeners = procs.port_listeners(host, port)
    if handle.pid in listeners:
        return Listeners(ours=True)  # the launch itself, alive or exited since
    if not listeners:
        return Listeners(ours=False)
    # After the socket scan: a member that listened then and lives now is found.
    members = procs.members(handle, tag=handle.tag, tag_prefix=None)
    if any(pid is not None and pid in members for pid in listeners):
        return Listeners(ours=True)
    return tuple(listeners)


async def port_taken(parts: Parts, record: ServerRecord) -> str | None:
    """Why the server port cannot take a new launch now (None: nothing listens on it).
    Called after the old server was torn down, so any listener is not ours."""
    s = parts.settings.server
    try:
        holders = await asyncio.to_thread(held_still, parts.procs, s.host, s.port)
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


async def listeners_of(parts: Parts, record: ServerRecord, handle: ServerHandle) -> Listeners:
    """``judge_listeners`` for ``handle`` on the server port, in a worker thread. When the
    socket table cannot be read, the 200 counts as ours (and a warning says so once):
    rather that than never call anything ready."""
    s = parts.settings.server
    try:
        return await asyncio.to_thread(judge_listeners, parts.procs, handle, s.host, s.port)
    except PortsUnreadable as exc:
        record.warn(f"readiness is not checked against the port's owner: {exc}")
        return Listeners(ours=True)
