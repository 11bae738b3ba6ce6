"""The simulated server's HTTP endpoints, SGLang 0.5.23's paths and answers.

A thread per connection (``ThreadingHTTPServer``) with uvicorn's listen backlog (2048;
SGLang passes ``backlog=2048``), HTTP/1.1 keep-alive, and streamed answers in chunked
transfer encoding as uvicorn sends a ``StreamingResponse``. What the endpoints answer is
read from an ``App`` (the launcher): readiness, health, info, metrics, and the engine
that admits generations.
"""

from __future__ import annotations

import json
import socket
import socketserver
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from sglang_supervisor.sim import generate
from sglang_supervisor.sim.flags import log
from sglang_supervisor.sim.generate import BadRequest, GenRequest, Kind, Output, sse
from sglang_supervisor.sim.load import Engine
from sglang_supervisor.sim.runtime import Runtime

#: uvicorn's (and SGLang's) listen backlog.
BACKLOG = 2048
MAX_BODY_BYTES = 16 * 2**20

_GENERATION_PATHS: dict[str, Kind] = {
    "/generate": "generate",
    "/v1/completions": "completions",
    "/v1/chat/completions": "chat",
}


class App(Protocol):
    """What the endpoints read from the server."""

    engine: Engine
    #: The endpoints that change the running server (sglang_supervisor.sim.runtime).
    runtime: Runtime
    context_length: int
    tokens_per_s: float

    @property
    def served_model_name(self) -> str:
        """The name requests address (a weights update renames it)."""
        ...

    def health(self, generate: bool) -> tuple[int, str]:
        """(status, body) of /health, or of /health_generate (a generation's time)."""
        ...

    def accepting(self) -> str | None:
        """None when generations are accepted, else why not (the server's phase)."""
        ...

    def server_info(self) -> dict[str, Any]: ...

    def model_info(self) -> dict[str, Any]: ...

    def models(self) -> dict[str, Any]: ...

    def metrics_text(self) -> bytes | None:
        """None when the server runs without ``--enable-metrics``."""
        ...


class HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = BACKLOG

    def __init__(
        self, address: tuple[str, int], app: App, access_log_exclude: tuple[str, ...] = ()
    ) -> None:
        host = address[0]
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.app = app
        #: ``--uvicorn-access-log-exclude-prefixes``: no access line for these paths.
        self.access_log_exclude = tuple(p for p in access_log_exclude if p)
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, which can stall on DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = int(self.server_address[1])


class _Handler(BaseHTTPRequestHandler):
    # Headers and body go out in separate writes: with Nagle's algorithm on, a kept-alive
    # client's delayed ACK would hold every answer back ~40 ms.
    disable_nagle_algorithm = True
    # A client that sends half a request must not hold a thread forever.
    timeout = 30
    protocol_version = "HTTP/1.1"
    server: HttpServer

    def log_message(self, format: str, *args: Any) -> None:
        log(f"INFO:     {self.client_address[0]} - {format % args}")

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # One access line per request, as uvicorn writes it; SGLang's path filter
        # (UvicornAccessLogFilter) drops the lines of excluded path prefixes.
        parts = self.requestline.split()
        if len(parts) >= 2 and parts[1].startswith(self.server.access_log_exclude):
            return
        try:
            phrase = HTTPStatus(int(code)).phrase
        except ValueError:
            phrase = ""
        log(
            f'INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" '
            f"{code} {phrase}"
        )

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, data: object) -> None:
        self._send(status, json.dumps(data).encode())

    def _runtime(self, body: bytes = b"") -> bool:
        """Answer a runtime endpoint (True), or leave ``self.path`` to the others."""
        path = self.path.split("?", 1)[0]
        answer = self.server.app.runtime.handle(
            self.command, path, body, self.headers.get("Authorization")
        )
        if answer is None:
            return False
        status, content_type, data = answer
        self._send(status, data, content_type)
        return True

    def _unauthorized(self, path: str) -> bool:
        """Answer SGLang's 401 where the server's keys refuse this request (True)."""
        runtime = self.server.app.runtime
        if runtime.authorized(self.command, path, self.headers.get("Authorization")):
            return False
        self._json(401, {"error": "Unauthorized"})
        return True

    def do_GET(self) -> None:
        app = self.server.app
        path = self.path.split("?", 1)[0]
        if self._unauthorized(path):
            return
        if self._runtime():
            return
        if path in ("/health", "/health_generate"):
            status, text = app.health(path == "/health_generate")
            self._send(status, text.encode(), "text/plain")
        elif path in ("/server_info", "/get_server_info"):
            self._json(200, app.server_info())
        elif path in ("/model_info", "/get_model_info"):
            self._json(200, app.model_info())
        elif path == "/v1/models":
            self._json(200, app.models())
        elif path == "/metrics":
            exposition = app.metrics_text()
            if exposition is None:
                self._json(404, {"detail": "Not Found"})
            else:
                self._send(200, exposition, "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._json(404, {"detail": "Not Found"})

    do_HEAD = do_GET

    def _body(self) -> bytes | None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            self.close_connection = True
            self._json(400, {"error": {"message": "bad Content-Length"}})
            return None
        return self.rfile.read(length)

    def do_PUT(self) -> None:
        body = self._body()
        if body is not None and not self._runtime(body):
            self._json(404, {"detail": "Not Found"})

    do_DELETE = do_PUT

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            self.close_connection = True
            self._json(400, {"error": {"message": "bad Content-Length"}})
            return
        body = self.rfile.read(length)
        if self._unauthorized(path):
            return
        if self._runtime(body):
            return
        kind = _GENERATION_PATHS.get(path)
        if kind is None:
            self._json(404, {"detail": "Not Found"})
            return
        app = self.server.app
        try:
            req = generate.parse(kind, body, app.served_model_name, app.context_length)
        except BadRequest as exc:
            self._json(400, exc.body)
            return
        self._generate(app, req)

    # -- generations --

    def _generate(self, app: App, req: GenRequest) -> None:
        app.runtime.log_request(req.prompt)
        # A weights update waits for the generations in flight and holds new ones.
        with app.runtime.model_lock.reading():
            self._generate_now(app, req)

    def _generate_now(self, app: App, req: GenRequest) -> None:
        why = app.accepting()
        ticket = (
            None if why else app.engine.submit(req.prompt, req.prompt_tokens, req.max_new_tokens)
        )
        if ticket is None:
            message = f"the server is {why or 'shutting down'}"
            self._json(503, generate.error_body(req.kind, message, 503))
            return
        out = Output(req, app.runtime.piece())
        try:
            if req.stream:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
            # Tokens as the engine's decode steps make them (its prefill makes the first).
            seen, ended = 0, False
            while not ended:
                got, ended = app.engine.wait_tokens(ticket, seen)
                got = min(got, req.max_new_tokens)
                if seen == 0 and got > 0:
                    out.cached_tokens = ticket.cached
                    for event in out.first_events():
                        self._event(req, event)
                if req.stream:
                    for i in range(seen, got):
                        self._chunk(sse(out.token_event(i)))
                seen = max(seen, got)
            if seen < req.max_new_tokens:
                raise OSError("aborted by the engine")  # cut, as SGLang's abort would be
            for event in out.last_events():
                self._event(req, event)
            if req.stream:
                self._chunk(sse("[DONE]"))
                self._chunk(b"")  # the chunked encoding's last chunk
            else:
                self._json(200, out.answer())
        except OSError:  # the client went away (SGLang aborts the request)
            self.close_connection = True
        finally:
            app.engine.finish(ticket)

    def _event(self, req: GenRequest, event: dict[str, Any]) -> None:
        if req.stream:
            self._chunk(sse(event))

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
