"""The API's uvicorn server: its listening socket (``listen_socket``: Nagle off on every
connection) and a server that leaves the signals to the daemon (``ApiServer``)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import uvicorn


def listen_socket(config: uvicorn.Config) -> socket.socket:
    """The API's listening socket, bound by uvicorn, with Nagle off on every connection.

    uvicorn's ``bind_socket`` creates it with protocol 0, and asyncio sets TCP_NODELAY
    only on accepted sockets whose protocol reads IPPROTO_TCP: every kept-alive answer
    (written as headers, then body) then waited ~40 ms for the client's delayed ACK.
    Re-wrapping the descriptor lets the kernel report the real protocol (TCP), and the
    listener's own TCP_NODELAY is inherited by what it accepts. Raises ``SystemExit``
    (uvicorn logged why) when it cannot bind.
    """
    bound = config.bind_socket()
    if bound.family not in (socket.AF_INET, socket.AF_INET6):
        return bound  # a Unix socket: no Nagle
    sock = socket.socket(fileno=bound.detach())  # family, type and protocol read back
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class ApiServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the daemon's decide, and stop it through
    ``should_exit`` / ``force_exit`` (uvicorn would replace them while serving, then
    re-raise the signal it caught once serving ends)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
