"""The API's listening socket: Nagle is off on every connection it accepts.

With Nagle on, an answer written as headers then body waits for the client's delayed ACK
(~40 ms) on every request of a kept-alive connection after the first (44 ms per
``GET /healthz`` measured; 3 ms on new connections): Prometheus, the CLI's follower and
browsers all keep connections alive. tests/benchmarks/bench_api.py measures the latency.
"""

from __future__ import annotations

import asyncio
import socket

import uvicorn

from sglang_supervisor_api.listener import listen_socket


async def _nodelay_of_accepted(sock: socket.socket) -> int:
    seen: asyncio.Queue[int] = asyncio.Queue()

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = writer.get_extra_info("socket")
        seen.put_nowait(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(accepted, sock=sock)
    async with server:
        host, port = sock.getsockname()[:2]
        _reader, writer = await asyncio.open_connection(host, port)
        value = await asyncio.wait_for(seen.get(), 10)
        writer.close()
        await writer.wait_closed()
    return value


def test_accepted_api_connections_have_nagle_off() -> None:
    config = uvicorn.Config(app=lambda *_: None, host="127.0.0.1", port=0)
    sock = listen_socket(config)
    assert asyncio.run(_nodelay_of_accepted(sock)) != 0
