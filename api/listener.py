"""The API's uvicorn server: its listening socket (``listen_socket``: Nagle off on every
connection), its connections (``first_request_within``: one that starts no request in
time is closed) and a server that leaves the signals to the daemon (``ApiServer``)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol


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


def first_request_within(timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol (``uvicorn.Config(http=...)``), except that a connection
    whose first request has not begun ``timeout_s`` after it opened (nothing sent, or
    headers trickling in) is closed. uvicorn arms its idle timeout only after a
    response, and every open connection counts against ``[api] max_connections``
    (``limit_concurrency``): idle sockets would hold its slots, and the API answer 503
    to everyone, for as long as they liked."""

    class FirstRequestWithin(H11Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # type: ignore[arg-type]
            self._first_request = self.loop.call_later(timeout_s, self._no_request)

        def _no_request(self) -> None:
            if self.cycle is None and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._first_request.cancel()
            super().connection_lost(exc)

    return FirstRequestWithin


class ApiServer(uvicorn.Server):
    """uvicorn without its own signal handlers: the daemon's decide, and stop it through
    ``should_exit`` / ``force_exit`` (uvicorn would replace them while serving, then
    re-raise the signal it caught once serving ends)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
