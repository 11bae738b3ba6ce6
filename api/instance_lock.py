"""One instance, one daemon, host-wide: an abstract Unix socket named after the instance.

The state directory's lock (``sglang_supervisor_api.state_lock``) cannot see a daemon whose state
directory was deleted under it, nor one with another state directory and the same ``instance``
(a copied config); either newcomer took the running server for its own leftovers and
killed it. The instance tag is what teardown matches, so the instance itself is locked:
the daemon binds ``\\0sglang-supervisor/<instance>`` (Linux abstract namespace) and
listens on it for its whole life. No file: the kernel drops the name the moment the
process ends, however it ends (SIGKILL too), and deleting directories cannot lose it.
A newcomer that finds the name taken connects to it and reads the owner's pid and uid
with ``SO_PEERCRED`` (which the kernel fills in: no process can lie about it).

Any local user can bind any abstract name, though, and the default instance is
computable from the state directory's path: a squatter of another uid that bound it
first made the daemon exit 2 ("already owned") and ``cleanup`` refuse, and the unit's
``RestartPreventExitStatus=2`` kept the service down. So only a holder of the daemon's
own uid is an owner. A name held by anyone else is left to them: the daemon binds
``\\0sglang-supervisor~<digest>/<random>`` instead (a random name no one can take
before it is chosen), and a daemon looks at every holder of the instance's names
(``/proc/net/unix`` lists them; :func:`owners`) — another one of its uid on any of them
is the owner, whichever name it holds. Two daemons of one instance starting at the
same instant may both see the other and both exit 2; neither runs unseen beside the
other. Abstract names are per network namespace: daemons in separate network
namespaces (containers) do not see each other, and never share a PID namespace's
processes anyway when both are isolated. Standard library only.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("supervisor")

_PREFIX = "sglang-supervisor/"
#: The names a daemon takes when its instance's own name is held by another user.
_FALLBACK_PREFIX = "sglang-supervisor~"
PROC_NET_UNIX = Path("/proc/net/unix")


class InstanceBusy(RuntimeError):
    """Another live daemon owns the instance; ``pid`` is its pid (None: not readable)."""

    def __init__(self, instance: str, pid: int | None) -> None:
        who = "another daemon" if pid is None else f"daemon pid {pid}"
        super().__init__(
            f"instance {instance!r} is already owned by {who} on this host (its server is "
            "not touched); stop that daemon, or give this one another `instance` in its "
            "config (each state dir needs its own instance)"
        )
        self.instance = instance
        self.pid = pid


@dataclass(frozen=True)
class Holder:
    """A process listening on one of an instance's names."""

    name: bytes
    pid: int
    uid: int


def socket_name(instance: str) -> bytes:
    """The abstract name (leading NUL); a long instance is shortened by its digest (the
    kernel allows 107 bytes)."""
    name = (_PREFIX + instance).encode()
    if len(name) > 100:
        digest = hashlib.sha256(instance.encode()).hexdigest()[:32]
        name = (_PREFIX + instance[:40] + "~" + digest).encode()
    return b"\0" + name


def _fallback_prefix(instance: str) -> bytes:
    return b"\0" + (_FALLBACK_PREFIX + hashlib.sha256(instance.encode()).hexdigest()[:24]).encode()


def hold_instance(instance: str) -> socket.socket:
    """Own ``instance`` for this process's life (keep the socket; close it to let go).

    The socket is non-blocking and not inherited by children. Its owner should accept
    (and close) what connects, so the backlog never fills: ``accept_and_close``. Raises
    ``InstanceBusy`` naming the owner's pid: a process of this one's uid listening on
    any of the instance's names.
    """
    uid = os.geteuid()
    base = socket_name(instance)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.bind(base)
        except OSError:
            holder = _holder(base)
            if holder is not None and holder.uid == uid:
                raise InstanceBusy(instance, holder.pid) from None
            # Another user's, or a holder that does not answer (bound, not listening, or
            # never accepting: a daemon listens from its first instant and accepts).
            who = (
                "a process that does not answer"
                if holder is None
                else (f"pid {holder.pid} of uid {holder.uid}")
            )
            log.warning(
                "instance %r: its name %r is held by %s, not by this daemon's user (uid "
                "%d): not an owner; this daemon holds the instance under another name",
                instance,
                base[1:].decode(errors="replace"),
                who,
                uid,
            )
            sock.bind(_fallback_prefix(instance) + b"/" + secrets.token_hex(6).encode())
        sock.listen(16)
        ours = sock.getsockname()
        # Held now, and visible to a newcomer: any other daemon of this uid is the owner
        # (one that took a fallback name while the instance's own was squatted, too).
        other = next((h for h in owners(instance) if h.name != ours), None)
        if other is not None:
            raise InstanceBusy(instance, other.pid)
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def owner_pid(instance: str) -> int | None:
    """The pid of the daemon owning ``instance`` — a process of this one's uid holding
    one of its names — or None (none does, or it cannot be read)."""
    found = owners(instance)
    return found[0].pid if found else None


def owners(instance: str) -> list[Holder]:
    """The holders of the instance's names that are of this process's uid, its own name
    first. Holders of another uid are squatters, not owners."""
    uid = os.geteuid()
    return [h for h in _holders(instance) if h.uid == uid]


def _holders(instance: str) -> list[Holder]:
    base = socket_name(instance)
    # Every one (a squatter may bind many): a non-blocking connect costs microseconds.
    return [h for h in map(_holder, [base, *_fallback_names(instance)]) if h is not None]


def _fallback_names(instance: str) -> list[bytes]:
    """The fallback names that are bound now (``/proc/net/unix``, this network namespace)."""
    prefix = "@" + _fallback_prefix(instance)[1:].decode() + "/"
    try:
        text = PROC_NET_UNIX.read_text(errors="replace")
    except OSError:
        return []
    names = []
    for line in text.splitlines()[1:]:
        fields = line.split(maxsplit=7)
        if len(fields) == 8 and fields[7].startswith(prefix):
            names.append(b"\0" + fields[7][1:].encode())
    return sorted(set(names))


def _holder(name: bytes) -> Holder | None:
    """Who listens on ``name`` (None: nobody, or it does not answer: its backlog is full).
    Non-blocking: a holder that never accepts cannot make this wait."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.setblocking(False)
        try:
            s.connect(name)
        except OSError:
            return None
        with contextlib.suppress(OSError):
            creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid, uid, _gid = struct.unpack("3i", creds)
            if pid > 0:
                return Holder(name, pid, uid)
    return None


def accept_and_close(sock: socket.socket) -> None:
    """Answer whoever asked who owns the instance (they have read our pid already)."""
    with contextlib.suppress(BlockingIOError, InterruptedError, OSError):
        while True:
            conn, _ = sock.accept()
            conn.close()
