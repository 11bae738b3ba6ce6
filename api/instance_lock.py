"""One instance, one daemon, host-wide: an abstract Unix socket named after the instance.

The state directory's lock (``sglang_supervisor_api.state_lock``) cannot see a daemon whose state
directory was deleted under it, nor one with another state directory and the same ``instance``
(a copied config); either newcomer took the running server for its own leftovers and
killed it. The instance tag is what teardown matches, so the instance itself is locked:
the daemon binds ``\\0sglang-supervisor/<instance>`` (Linux abstract namespace) and
listens on it for its whole life. No file: the kernel drops the name the moment the
process ends, however it ends (SIGKILL too), and deleting directories cannot lose it.
A newcomer that finds the name taken connects to it and reads the owner's pid with
``SO_PEERCRED``. Abstract names are per network namespace: daemons in separate network
namespaces (containers) do not see each other, and never share a PID namespace's
processes anyway when both are isolated. Standard library only.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import struct

_PREFIX = "sglang-supervisor/"


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


def socket_name(instance: str) -> bytes:
    """The abstract name (leading NUL); a long instance is shortened by its digest (the
    kernel allows 107 bytes)."""
    name = (_PREFIX + instance).encode()
    if len(name) > 100:
        digest = hashlib.sha256(instance.encode()).hexdigest()[:32]
        name = (_PREFIX + instance[:40] + "~" + digest).encode()
    return b"\0" + name


def hold_instance(instance: str) -> socket.socket:
    """Own ``instance`` for this process's life (keep the socket; close it to let go).

    The socket is non-blocking and not inherited by children. Its owner should accept
    (and close) what connects, so the backlog never fills: ``accept_and_close``. Raises
    ``InstanceBusy`` naming the owner's pid.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(socket_name(instance))
    except OSError:
        sock.close()
        raise InstanceBusy(instance, owner_pid(instance)) from None
    sock.listen(16)
    sock.setblocking(False)
    return sock


def owner_pid(instance: str) -> int | None:
    """The pid of the daemon owning ``instance`` (None: none does, or it cannot be read)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(socket_name(instance))
        except OSError:
            return None
        with contextlib.suppress(OSError):
            creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid, _uid, _gid = struct.unpack("3i", creds)
            return pid if pid > 0 else None
    return None


def accept_and_close(sock: socket.socket) -> None:
    """Answer whoever asked who owns the instance (they have read our pid already)."""
    with contextlib.suppress(BlockingIOError, InterruptedError, OSError):
        while True:
            conn, _ = sock.accept()
            conn.close()
