"""Who listens on the server's TCP port: checked before every launch (nothing of ours may
hold it then) and at readiness (the listener that answered must be a member of the launch).

``psutil.net_connections`` reads ``/proc/net/tcp{,6}`` (any user may) and maps each
socket to its process through ``/proc/<pid>/fd``, which only root, or the socket's own
user, may read: a listener of another user reads as ``None`` ("not visible"). Our own
launches are always visible to us (same user, or root), so an invisible listener is
never ours.
"""

from __future__ import annotations

import contextlib
import socket

import psutil


class PortsUnreadable(RuntimeError):
    """The kernel's socket tables could not be read (the message says why)."""


_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})


def collides(listen_ip: str, host: str) -> bool:
    """Whether a listener on ``listen_ip`` keeps ``host`` from binding the same port: a
    wildcard on either side does, as does the same address (a name, not an address,
    counts as a wildcard: it may resolve to anything)."""
    host = host.strip("[]")
    if host in _WILDCARDS or listen_ip in _WILDCARDS or listen_ip == host:
        return True
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    except OSError:
        return True
    return False


def port_listeners(host: str, port: int) -> list[int | None]:
    """Who holds ``host:port``: the pids of TCP listeners whose address collides with
    ``host`` (``None``: not visible to this daemon); when none is seen but the port still
    cannot be bound (a socket of another network namespace), ``[None]``. Blocking;
    raises ``PortsUnreadable``."""
    try:
        conns = psutil.net_connections("tcp")
    except (psutil.Error, OSError) as exc:
        raise PortsUnreadable(f"cannot read the TCP socket table: {exc}") from exc
    found: list[int | None] = []
    for conn in conns:
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        if collides(conn.laddr.ip, host) and conn.pid not in found:
            found.append(conn.pid)
    if not found and bind_problem(host, port) is not None:
        found.append(None)
    return found


def describe_pid(pid: int | None, port: int) -> str:
    """``pid 123 (python3 -m http.server 30000)``, or what to do when it is not visible."""
    if pid is None:
        return (
            "a process this daemon cannot see (another user's; run the daemon as root, "
            f"or look with `ss -ltnp 'sport = :{port}'`)"
        )
    text = f"pid {pid}"
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(pid)
        cmd = " ".join(p.cmdline())[:120] or p.name()
        text += f" ({cmd})"
    return text


def bind_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound now (None: it can). Catches what the listener
    scan cannot see (another network namespace's socket is invisible, its bind is not)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return f"cannot bind {host}:{port}: {exc.strerror}"
    return None
