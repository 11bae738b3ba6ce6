"""Generation requests of the simulated server, in SGLang 0.5.23's wire formats.

Three endpoints, streaming or not:

* ``POST /generate`` — SGLang's native API (http_server.py ``generate_request``). Streamed,
  each event is ``data: {"text": <the text so far>, "meta_info": {...}}`` (the output is
  cumulative: ``incremental_streaming_output`` is off by default) and the stream ends with
  ``data: [DONE]``; the last event's ``meta_info.finish_reason`` is
  ``{"type": "length", "length": N}``, the others' ``null``.
* ``POST /v1/completions`` — ``text_completion`` objects (openai/protocol.py
  ``CompletionResponse`` / ``CompletionStreamResponse``); streamed, one chunk per token
  with the new text only, ``finish_reason`` on the last, then ``data: [DONE]``.
* ``POST /v1/chat/completions`` — ``chat.completion`` / ``chat.completion.chunk``; streamed,
  a first chunk with ``delta: {"role": "assistant", "content": ""}``, one per token, a last
  one with an empty delta and ``finish_reason``, then ``data: [DONE]``.

With ``stream_options.include_usage`` a usage chunk comes before ``[DONE]``. Tokens come at
the server's pace (``SGLANG_SIM_TOKENS_PER_S`` per request), after the request was
admitted by the engine and its prompt prefilled.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["generate", "completions", "chat"]

DEFAULT_MAX_NEW_TOKENS = 128
#: SGLang's CompletionRequest.max_tokens default.
DEFAULT_COMPLETION_TOKENS = 16
PIECE = "sim"


class BadRequest(Exception):
    """A request SGLang would refuse with a 400; ``body`` is SGLang's answer for its API."""

    def __init__(self, kind: Kind, message: str) -> None:
        super().__init__(message)
        self.body = error_body(kind, message, 400)


def error_body(kind: Kind, message: str, code: int) -> dict[str, Any]:
    """SGLang's error shape: the native API's ``{"error": ...}`` or OpenAI's ErrorResponse."""
    if kind == "generate":
        return {"error": {"message": message}}
    kinds = {400: "BadRequestError", 503: "ServiceUnavailableError"}
    return {
        "object": "error",
        "message": message,
        "type": kinds.get(code, "InternalServerError"),
        "param": None,
        "code": code,
    }


@dataclass(frozen=True)
class GenRequest:
    kind: Kind
    prompt: str
    prompt_tokens: int
    max_new_tokens: int
    stream: bool
    model: str
    include_usage: bool = False


def parse(kind: Kind, body: bytes, served_model: str, context_length: int) -> GenRequest:
    """The request's prompt, length and options; ``BadRequest`` says what is wrong."""
    try:
        req = json.loads(body or b"{}")
        if not isinstance(req, dict):
            raise ValueError("the body must be a JSON object")
        if kind == "generate":
            params = req.get("sampling_params") or {}
            max_new = int(params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS))
            if "input_ids" in req and "text" not in req:
                ids = req["input_ids"]
                if not isinstance(ids, list):
                    raise ValueError("input_ids must be a list of token ids")
                prompt, prompt_tokens = json.dumps(ids), len(ids)
            else:
                prompt = req.get("text", "")
                if not isinstance(prompt, str):
                    raise ValueError("text must be a string (batches are not simulated)")
                prompt_tokens = max(1, len(prompt) // 4)
            model = served_model
        else:
            if kind == "completions":
                prompt = req.get("prompt", "")
                if not isinstance(prompt, str):
                    raise ValueError("prompt must be a string (batches are not simulated)")
                default = DEFAULT_COMPLETION_TOKENS
            else:
                messages = req.get("messages")
                if not isinstance(messages, list) or not messages:
                    raise ValueError("messages must be a non-empty list")
                prompt = json.dumps(messages)
                default = DEFAULT_MAX_NEW_TOKENS
            limit = req.get("max_completion_tokens", req.get("max_tokens"))
            max_new = int(default if limit is None else limit)
            prompt_tokens = max(1, len(prompt) // 4)
            model = str(req.get("model") or served_model)
        options = req.get("stream_options") or {}
        stream = bool(req.get("stream", False))
        include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
    except (ValueError, TypeError, AttributeError) as exc:
        raise BadRequest(kind, f"invalid request: {exc}") from None
    if max_new < 0 or prompt_tokens + max_new > context_length:
        raise BadRequest(
            kind,
            f"Requested token count exceeds the model's maximum context length of "
            f"{context_length} tokens. You requested a total of {prompt_tokens + max_new} "
            f"tokens: {prompt_tokens} tokens from the input messages and {max_new} tokens "
            "for the completion.",
        )
    return GenRequest(kind, prompt, prompt_tokens, max_new, stream, model, include_usage)


class Output:
    """The events and the final answer of one request, in its endpoint's format."""

    def __init__(self, req: GenRequest, piece: str = PIECE) -> None:
        self.req = req
        #: The one token every answer repeats: what the weights in memory "generate".
        self.piece = piece
        self.created = int(time.time())
        prefix = {"generate": "", "completions": "cmpl-", "chat": "chatcmpl-"}[req.kind]
        self.id = prefix + uuid.uuid4().hex
        self.cached_tokens = 0
        self._start = time.monotonic()

    def text(self, n: int) -> str:
        return " ".join([self.piece] * n)

    def _meta(self, n: int, done: bool) -> dict[str, Any]:
        return {
            "id": self.id,
            "finish_reason": {"type": "length", "length": n} if done else None,
            "prompt_tokens": self.req.prompt_tokens,
            "completion_tokens": n,
            "cached_tokens": self.cached_tokens,
            "e2e_latency": round(time.monotonic() - self._start, 4),
        }

    def _usage(self, n: int) -> dict[str, Any]:
        p = self.req.prompt_tokens
        return {
            "prompt_tokens": p,
            "total_tokens": p + n,
            "completion_tokens": n,
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
        }

    def _envelope(
        self, obj: str, choices: list[dict[str, Any]], usage: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The OpenAI-style object around the choices (a chunk, or a whole answer)."""
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.req.model,
            "choices": choices,
            "usage": usage,
        }

    def _chunk_object(self) -> str:
        return "text_completion" if self.req.kind == "completions" else "chat.completion.chunk"

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        return self._envelope(self._chunk_object(), [choice], None)

    def first_events(self) -> Iterator[dict[str, Any]]:
        """Events before the first token."""
        if self.req.kind == "chat":
            yield self._chunk(
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": "", "reasoning_content": None},
                    "logprobs": None,
                    "finish_reason": None,
                    "matched_stop": None,
                }
            )

    def token_event(self, i: int) -> dict[str, Any]:
        """The event of token ``i`` (0-based) of ``max_new_tokens``."""
        n = i + 1
        last = n == self.req.max_new_tokens
        piece = self.piece if i == 0 else " " + self.piece
        if self.req.kind == "generate":
            return {"text": self.text(n), "meta_info": self._meta(n, last)}
        if self.req.kind == "completions":
            return self._chunk(
                {
                    "index": 0,
                    "text": piece,
                    "logprobs": None,
                    "finish_reason": "length" if last else None,
                    "matched_stop": None,
                }
            )
        return self._chunk(
            {
                "index": 0,
                "delta": {"role": None, "content": piece, "reasoning_content": None},
                "logprobs": None,
                "finish_reason": None,
                "matched_stop": None,
            }
        )

    def last_events(self) -> Iterator[dict[str, Any]]:
        """Events after the last token (before ``[DONE]``)."""
        n = self.req.max_new_tokens
        if self.req.kind == "generate":
            if n == 0:
                yield {"text": "", "meta_info": self._meta(0, True)}
            return
        if self.req.kind == "chat":
            yield self._chunk(
                {
                    "index": 0,
                    "delta": {"role": None, "content": None, "reasoning_content": None},
                    "logprobs": None,
                    "finish_reason": "length",
                    "matched_stop": None,
                }
            )
        if self.req.include_usage:
            yield self._envelope(self._chunk_object(), [], self._usage(n))

    def answer(self) -> dict[str, Any]:
        """The whole answer of a request that does not stream."""
        n = self.req.max_new_tokens
        if self.req.kind == "generate":
            return {"text": self.text(n), "meta_info": self._meta(n, True)}
        if self.req.kind == "completions":
            choice: dict[str, Any] = {"index": 0, "text": self.text(n), "logprobs": None}
            obj = "text_completion"
        else:
            message = {"role": "assistant", "content": self.text(n), "reasoning_content": None}
            choice = {"index": 0, "message": message, "logprobs": None}
            obj = "chat.completion"
        choice.update(finish_reason="length", matched_stop=None)
        answer = self._envelope(obj, [choice], self._usage(n))
        answer["metadata"] = {"weight_version": "default"}
        return answer


def sse(event: dict[str, Any] | str) -> bytes:
    """One server-sent event as SGLang writes it."""
    data = event if isinstance(event, str) else json.dumps(event, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
