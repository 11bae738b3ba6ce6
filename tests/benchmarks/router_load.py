"""A bounded load of streaming clients through a router, and what each client saw.

``concurrency`` clients loop until told to stop: each sends one streamed generation
(``/generate``, ``/v1/completions`` and ``/v1/chat/completions`` in turn) of a random
number of tokens, reads it to its end, and records the outcome:

* ``ok`` — 200, every token, and the closing ``data: [DONE]``;
* ``failed`` — no token reached the client (an error status, a refused or reset
  connection, a timeout before the first token);
* ``truncated`` — some tokens came, then the stream broke off (no ``[DONE]``, or fewer
  tokens than asked for).

Loopback only, bounded in clients and in time: ``stop()`` ends new requests and the
clients finish the ones they hold (each bounded by ``request_timeout_s``).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

ENDPOINTS = ("/generate", "/v1/completions", "/v1/chat/completions")


@dataclass
class Outcome:
    endpoint: str
    started: float
    outcome: str = "failed"
    ttft_s: float | None = None
    e2e_s: float | None = None
    tokens: int = 0
    asked: int = 0
    error: str = ""


@dataclass
class LoadSpec:
    concurrency: int = 16
    #: Tokens per request, uniform in this range (at the server's pace: the duration).
    min_tokens: int = 40
    max_tokens: int = 100
    request_timeout_s: float = 120.0
    seed: int = 0


def _body(endpoint: str, n: int, i: int) -> dict[str, Any]:
    prompt = f"request {i}: tell me about routers " * 4
    if endpoint == "/generate":
        return {"text": prompt, "sampling_params": {"max_new_tokens": n}, "stream": True}
    if endpoint == "/v1/completions":
        return {"model": "default", "prompt": prompt, "max_tokens": n, "stream": True}
    return {
        "model": "default",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": n,
        "stream": True,
    }


def _tokens_in(endpoint: str, event: dict[str, Any]) -> int:
    """How many new tokens one event carries."""
    if endpoint == "/generate":
        meta = event.get("meta_info") or {}
        return int(meta.get("completion_tokens") or 0)  # cumulative; handled by caller
    choices = event.get("choices") or []
    if not choices:
        return 0
    c = choices[0]
    piece = (
        c.get("text") if endpoint == "/v1/completions" else (c.get("delta") or {}).get("content")
    )
    return 1 if piece else 0


@dataclass
class Load:
    url: str
    spec: LoadSpec
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _rng: random.Random = field(default_factory=random.Random)

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        self._rng.seed(self.spec.seed)
        limits = httpx.Limits(max_connections=self.spec.concurrency * 2)
        timeout = httpx.Timeout(self.spec.request_timeout_s, connect=10.0)
        async with httpx.AsyncClient(
            base_url=self.url, limits=limits, timeout=timeout, trust_env=False
        ) as client:
            await asyncio.gather(*(self._client(client, k) for k in range(self.spec.concurrency)))

    async def _client(self, client: httpx.AsyncClient, k: int) -> None:
        i = k
        while not self._stop.is_set():
            endpoint = ENDPOINTS[i % len(ENDPOINTS)]
            n = self._rng.randint(self.spec.min_tokens, self.spec.max_tokens)
            o = Outcome(endpoint, time.monotonic(), asked=n)
            self.outcomes.append(o)
            await self._one(client, o, _body(endpoint, n, i))
            i += self.spec.concurrency
            if o.outcome == "failed":
                await asyncio.sleep(0.1)  # a client backs off a little after an error

    async def _one(self, client: httpx.AsyncClient, o: Outcome, body: dict[str, Any]) -> None:
        done = False
        try:
            async with client.stream("POST", o.endpoint, json=body) as r:
                if r.status_code != 200:
                    o.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                    return
                async for line in r.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[len("data: ") :]
                    if data == "[DONE]":
                        done = True
                        break
                    event = json.loads(data)
                    if "error" in event or event.get("object") == "error":
                        o.error = f"error event: {data[:200]}"
                        break
                    got = _tokens_in(o.endpoint, event)
                    new = got if o.endpoint != "/generate" else max(0, got - o.tokens)
                    if new and o.ttft_s is None:
                        o.ttft_s = time.monotonic() - o.started
                    o.tokens += new
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            o.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            o.e2e_s = time.monotonic() - o.started
            if done and o.tokens >= o.asked:
                o.outcome = "ok"
            elif o.tokens > 0:
                o.outcome = "truncated"
                o.error = o.error or f"{o.tokens} of {o.asked} tokens, no [DONE]"
            else:
                o.outcome = "failed"


def pct(values: list[float], q: float) -> float | None:
    s = sorted(values)
    if not s:
        return None
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def window_stats(outcomes: list[Outcome]) -> dict[str, Any]:
    """Counts, and TTFT / end-to-end p50 and p99 of the ok requests (seconds)."""
    ok = [o for o in outcomes if o.outcome == "ok"]
    ttft = [o.ttft_s for o in ok if o.ttft_s is not None]
    e2e = [o.e2e_s for o in ok if o.e2e_s is not None]
    return {
        "requests": len(outcomes),
        "ok": len(ok),
        "failed": sum(o.outcome == "failed" for o in outcomes),
        "truncated": sum(o.outcome == "truncated" for o in outcomes),
        "ttft_p50_s": pct(ttft, 0.5),
        "ttft_p99_s": pct(ttft, 0.99),
        "e2e_p50_s": pct(e2e, 0.5),
        "e2e_p99_s": pct(e2e, 0.99),
        "errors": sorted({o.error for o in outcomes if o.outcome != "ok"})[:8],
    }
