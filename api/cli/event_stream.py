"""The daemon's event stream (``GET /events``, server-sent events) as an iterator of dicts.

The stream is read by httpx-sse (``EventSource``: the format's rules — fields, comments,
multi-line data, line endings — kept by a maintained reader); this module opens it, says
why it could not be opened, and decodes each event's JSON.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Self

import httpx
from httpx_sse import EventSource, SSEError

from sglang_supervisor_api.cli.client import Client, Json
from sglang_supervisor_api.cli.client_errors import ClientError, NotFound, StreamUnavailable


def open_event_stream(
    client: Client, *, replay: bool = False, read_timeout_s: float | None = 60.0
) -> EventStream:
    """Open ``GET /events`` (with the recent history first when ``replay``).

    Raises ``StreamUnavailable`` when the daemon offers no stream, ``ClientError`` when it
    cannot be reached.
    """
    stream = EventStream(client, replay=replay, read_timeout_s=read_timeout_s)
    stream.open()
    return stream


class EventStream:
    """An open ``GET /events`` stream; iterate for event dicts, ``close()`` to end it.

    The daemon sends ``event: <kind>`` and ``data: <json>`` per event and ``:`` comments
    (its keep-alive), which are skipped. Iteration ends when the daemon closes the stream;
    a broken connection raises ``ClientError``.
    """

    def __init__(self, client: Client, *, replay: bool, read_timeout_s: float | None) -> None:
        self._client = client
        self._replay = replay
        self._timeout = httpx.Timeout(10.0, read=read_timeout_s)
        self._response: httpx.Response | None = None

    def open(self) -> None:
        c = self._client
        params = {"replay": "true"} if self._replay else None
        try:
            request = c.http.build_request("GET", "/events", params=params, timeout=self._timeout)
            request.headers["Accept"] = "text/event-stream"
            response = c.http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise c.transport_error(exc) from exc
        kind = response.headers.get("content-type", "")
        if response.status_code != 200 or not kind.startswith("text/event-stream"):
            try:
                response.read()
                c.raise_for_status(response)
            except httpx.HTTPError:
                pass
            except NotFound as exc:
                raise StreamUnavailable(str(exc)) from exc
            finally:
                response.close()
            raise StreamUnavailable(
                f"GET /events answered {response.status_code} {kind or 'without a content type'}"
            )
        self._response = response

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """End the stream (also from another thread: the blocked reader then stops)."""
        response, self._response = self._response, None
        if response is not None:
            with contextlib.suppress(httpx.HTTPError, OSError, RuntimeError):
                response.close()

    def __iter__(self) -> Iterator[Json]:
        response = self._response
        if response is None:
            return
        try:
            for sse in EventSource(response).iter_sse():
                event = _decode_event(sse.data)
                if event is not None:
                    yield event
        except (httpx.HTTPError, SSEError) as exc:
            if self._response is None:  # closed on purpose
                return
            raise ClientError(f"the event stream from {self._client.url} broke: {exc}") from exc
        except (AttributeError, RuntimeError, OSError) as exc:
            # A close() from another thread can surface as almost anything in the reader.
            if self._response is None:
                return
            raise ClientError(f"the event stream from {self._client.url} broke: {exc}") from exc


def _decode_event(text: str) -> Json | None:
    try:
        event = json.loads(text)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None
