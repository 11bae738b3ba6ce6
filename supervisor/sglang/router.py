"""A client of sglang-router (SGLang's model gateway, 0.3.x) for one worker: this server.

The router's worker API, as sglang-router 0.3.2 serves it (sgl-model-gateway
``src/server.rs`` ``build_app``: the worker routes, read and exercised against the
installed router):

* ``POST /workers`` ``{"url": ...}`` -> 202 ``{"status": "accepted", "worker_id", "url",
  "location", "message"}``: registration is queued; a background job checks the worker
  (``/health``, ``/server_info``, ``/model_info``) and only then lists it. Adding a URL that
  is already listed answers 202 with the existing id and the job fails harmlessly.
* ``GET /workers`` -> ``{"workers": [{"id", "url", "model_id", "is_healthy", "load", ...}],
  "total", "stats"}``.
* ``DELETE /workers/{worker_id}`` (a UUID; a URL is refused with 400) -> 202, queued; 404
  ``WORKER_NOT_FOUND`` when it is not listed.
* With ``--api-key`` these routes want ``Authorization: Bearer <key>``.

Requests already forwarded to a worker finish when it is removed; new ones go elsewhere.
The router's own safety nets are slower than a planned change: it health-checks every
``--health-check-interval-secs`` (60) and drops a worker after 3 failures; retries (5, on
408/429/500/502/503/504) cannot resume a stream that was cut mid-way; the circuit breaker
opens after 10 failures. Hence: remove first, drain, then stop.

``RouterLink`` is what the engine calls; ``NoRouter`` is the same interface doing nothing
(no ``[router] url``).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from sglang_supervisor.config import RouterSettings, ServerSettings
from sglang_supervisor.files import FileRefused, read_regular

API_KEY_ENV = "SGLANG_SUPERVISOR_ROUTER_API_KEY"


class RouterError(RuntimeError):
    """The router could not be asked, or refused; the message says which call and why."""


@dataclass(frozen=True)
class RouterWorker:
    id: str
    url: str
    healthy: bool
    model_id: str | None = None
    load: int | None = None


def normalize_url(url: str) -> str:
    """``HTTP://Host:80/`` and ``http://host:80`` name the same worker."""
    parts = urlsplit(url.strip())
    path = parts.path.rstrip("/")
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{path}"


def default_worker_url(server: ServerSettings) -> str:
    """``http://<host>:<port>`` of the managed server; a wildcard host reads as loopback."""
    host = server.host
    if host in ("0.0.0.0", "", "::", "[::]"):
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{server.port}"


def read_api_key(settings: RouterSettings, env: dict[str, str] | None = None) -> str | None:
    """$SGLANG_SUPERVISOR_ROUTER_API_KEY, else the first line of ``api_key_file``."""
    environ = os.environ if env is None else env
    if key := environ.get(API_KEY_ENV, "").strip():
        return key
    if settings.api_key_file:
        try:
            read = read_regular(settings.api_key_file, "router API key file", max_bytes=64 << 10)
            return read.data.decode(errors="replace").strip() or None
        except OSError as exc:
            raise RouterError(
                f"cannot read the router's API key from {settings.api_key_file}: {exc.strerror}"
            ) from exc
        except FileRefused as exc:
            raise RouterError(str(exc)) from exc
    return None


class RouterClient:
    """Add, remove and list workers of one router (async; one ``httpx.AsyncClient``)."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=timeout_s,
            transport=transport,
            trust_env=False,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        what = f"{method} {self.url}{path}"
        try:
            r = await self._http.request(method, path, json=body)
        except httpx.TimeoutException as exc:
            msg = f"router did not answer {what} in time ({type(exc).__name__})"
            raise RouterError(msg) from None
        except httpx.TransportError as exc:
            msg = f"router unreachable: {what} failed: {type(exc).__name__}: {exc}"
            raise RouterError(msg) from None
        if r.status_code in (401, 403):
            raise RouterError(
                f"router refused {what} with {r.status_code}: set [router] api_key_file "
                f"(or ${API_KEY_ENV}) to the router's --api-key"
            )
        return r

    async def list_workers(self) -> list[RouterWorker]:
        r = await self._call("GET", "/workers")
        if r.status_code != 200:
            raise RouterError(f"router answered {r.status_code} to GET /workers: {r.text[:300]}")
        try:
            raw = r.json()["workers"]
            return [
                RouterWorker(
                    id=str(w["id"]),
                    url=str(w["url"]),
                    healthy=bool(w.get("is_healthy")),
                    model_id=w.get("model_id"),
                    load=w.get("load"),
                )
                for w in raw
            ]
        except (ValueError, KeyError, TypeError) as exc:
            raise RouterError(
                f"GET {self.url}/workers did not answer a worker list ({exc!r}): is {self.url} "
                "an sglang-router 0.3 or later?"
            ) from exc

    async def find(self, worker_url: str) -> RouterWorker | None:
        want = normalize_url(worker_url)
        for w in await self.list_workers():
            if normalize_url(w.url) == want:
                return w
        return None

    async def add(self, worker_url: str) -> None:
        """Queue the worker's registration (the router checks it before listing it)."""
        r = await self._call("POST", "/workers", {"url": worker_url})
        if r.status_code not in (200, 201, 202):
            raise RouterError(
                f"router answered {r.status_code} to POST /workers for {worker_url}: {r.text[:300]}"
            )

    async def remove(self, worker_url: str) -> bool:
        """Queue the worker's removal; False when the router did not list it."""
        worker = await self.find(worker_url)
        if worker is None:
            return False
        r = await self._call("DELETE", f"/workers/{worker.id}")
        if r.status_code == 404:
            return False
        if r.status_code not in (200, 202, 204):
            raise RouterError(
                f"router answered {r.status_code} to DELETE /workers/{worker.id} "
                f"({worker_url}): {r.text[:300]}"
            )
        return True

    async def wait_listed(
        self, worker_url: str, *, healthy: bool, timeout_s: float, poll_s: float = 0.1
    ) -> RouterWorker:
        """Until the router lists the worker (and, with ``healthy``, as healthy)."""
        deadline = time.monotonic() + timeout_s
        seen: RouterWorker | None = None
        while True:
            seen = await self.find(worker_url)
            if seen is not None and (seen.healthy or not healthy):
                return seen
            if time.monotonic() >= deadline:
                state = "not listed" if seen is None else "listed but not healthy"
                raise RouterError(
                    f"router {self.url} still has {worker_url} {state} after {timeout_s:g}s; "
                    "its log says why (the router checks /health, /server_info and "
                    "/model_info of the worker)"
                )
            await asyncio.sleep(poll_s)

    async def wait_gone(self, worker_url: str, *, timeout_s: float, poll_s: float = 0.05) -> None:
        deadline = time.monotonic() + timeout_s
        while await self.find(worker_url) is not None:
            if time.monotonic() >= deadline:
                raise RouterError(
                    f"router {self.url} still lists {worker_url} {timeout_s:g}s after its removal"
                )
            await asyncio.sleep(poll_s)


class WorkerLink(Protocol):
    """What the engine asks of the router around a stop and after a start."""

    @property
    def enabled(self) -> bool: ...

    @property
    def worker_url(self) -> str: ...

    #: Whether the router lists this server: True/False as last seen, None if unknown.
    registered: bool | None

    async def leave(self) -> str:
        """Take the server out of the router; returns what happened. ``RouterError``."""
        ...

    async def join(self) -> str:
        """Add the server and wait until the router lists it healthy. ``RouterError``."""
        ...

    async def check(self) -> str:
        """Whether the router answers its worker API now (before an apply's stop);
        returns what it lists. ``RouterError`` naming the router and what it answered."""
        ...

    async def aclose(self) -> None: ...


class NoRouter:
    """No ``[router] url``: nothing to tell anyone."""

    enabled = False
    worker_url = ""
    registered: bool | None = None

    async def leave(self) -> str:
        return "no router configured"

    async def join(self) -> str:
        return "no router configured"

    async def check(self) -> str:
        return "no router configured"

    async def aclose(self) -> None:
        return None


class RouterLink:
    """This server's registration in one sglang-router."""

    enabled = True

    def __init__(self, settings: RouterSettings, client: RouterClient, worker_url: str) -> None:
        self.settings = settings
        self.client = client
        self._worker_url = worker_url
        self.registered: bool | None = None

    @property
    def worker_url(self) -> str:
        return self._worker_url

    async def leave(self) -> str:
        removed = await self.client.remove(self._worker_url)
        if removed:
            await self.client.wait_gone(self._worker_url, timeout_s=self.settings.healthy_timeout_s)
        self.registered = False
        where = self.client.url
        if removed:
            return f"removed {self._worker_url} from the router {where}"
        return f"{self._worker_url} was not in the router {where}"

    async def join(self) -> str:
        # Only when not listed: the router queues every POST /workers as a job, and a
        # duplicate one still queued could re-add the worker after a later removal.
        listed = await self.client.find(self._worker_url)
        if listed is not None and not listed.healthy:
            # Marked unhealthy (say after an unplanned crash): its health checker would
            # take up to --health-check-interval-secs to notice the new server; re-add it.
            await self.client.remove(self._worker_url)
            await self.client.wait_gone(self._worker_url, timeout_s=self.settings.healthy_timeout_s)
            listed = None
        if listed is None:
            await self.client.add(self._worker_url)
        w = await self.client.wait_listed(
            self._worker_url, healthy=True, timeout_s=self.settings.healthy_timeout_s
        )
        self.registered = True
        return f"the router {self.client.url} lists {w.url} healthy (worker {w.id})"

    async def check(self) -> str:
        workers = await self.client.list_workers()
        return f"the router {self.client.url} answers GET /workers ({len(workers)} listed)"

    async def aclose(self) -> None:
        await self.client.aclose()


def build_link(
    router: RouterSettings,
    server: ServerSettings,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> WorkerLink:
    """A ``RouterLink`` for ``[router] url``, else ``NoRouter``. ``RouterError`` when the
    API key file cannot be read."""
    if not router.url:
        return NoRouter()
    client = RouterClient(
        router.url,
        api_key=read_api_key(router),
        timeout_s=router.request_timeout_s,
        transport=transport,
    )
    return RouterLink(router, client, router.worker_url or default_worker_url(server))
