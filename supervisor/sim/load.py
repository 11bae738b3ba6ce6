"""The simulated server's engine: KV-bound admission, a FIFO queue, a prefix cache, and a
built-in synthetic workload.

Every request — a real ``/generate`` or a synthetic one — needs KV tokens for its prompt
and its output. It is admitted, first come first served, while fewer than
``max_running`` requests run and its tokens fit the KV pool (``max_total_num_tokens``);
otherwise it waits, and so does everything behind it (SGLang's scheduler stops at the
first request it cannot fit). So running requests, the queue, token usage and throughput
move the way they do on a KV-bound SGLang: more KV tokens per GPU (a higher
``mem_fraction_static``, an fp8 KV cache) let more requests run at once.

The prefix cache holds the prompts (real requests) or shared prefixes (synthetic ones)
of running requests, plus, LRU, as many finished ones as the free device pool and the
hierarchical cache's host pool hold. A hit skips that part of the prefill. The host pool
raises the hit rate; it never admits more requests, since admission counts device tokens.

``SGLANG_SIM_LOAD=rate=R,avg_tokens=T[,out_tokens=O][,seed=S][,max_queue=Q]
[,prefixes=N][,prefix_share=F]``: requests arrive as a Poisson process at R per second
(R ≤ 2000) from the moment the server is ready; each needs ~T KV tokens (uniform in
[T/2, 3T/2], deterministic for a seed), of which O (default 256, at most half) are
generated at 100 tokens/s (real requests: at the server's pace,
``SGLANG_SIM_TOKENS_PER_S``); F (default 0.5) of T is a prefix shared with other
requests, one of N (default 256) prefixes, Zipf-popular. Arrivals finding Q (default 5000) requests
waiting are turned away. At SIGTERM the synthetic clients disconnect: their requests are
aborted at once, while real requests are still accepted and drain. All the bookkeeping runs
in ``tick()``, which the server calls every 0.1 s: no thread per request.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
import random
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

LOAD_ENV = "SGLANG_SIM_LOAD"
#: Simulated speeds: decode tokens/s of one request, prefill tokens/s.
DECODE_TOKENS_PER_S = 100.0
PREFILL_TOKENS_PER_S = 20000.0
MAX_RATE = 2000.0
#: Admissions the cache hit rate is averaged over (SGLang's gauge is recent, not lifetime).
HIT_RATE_WINDOW = 256
#: A stalled process does not replay the arrivals it missed beyond this many seconds.
MAX_CATCH_UP_S = 2.0


@dataclass(frozen=True)
class LoadSpec:
    """A synthetic workload (see the module docstring)."""

    rate: float
    avg_tokens: int
    out_tokens: int = 256
    seed: int = 0
    max_queue: int = 5000
    prefixes: int = 256
    prefix_share: float = 0.5

    def describe(self) -> str:
        return (
            f"rate={self.rate:g}/s, avg_tokens={self.avg_tokens}, out_tokens={self.out_tokens}, "
            f"seed={self.seed}, max_queue={self.max_queue}, prefixes={self.prefixes}, "
            f"prefix_share={self.prefix_share:g}"
        )


_LIMITS: dict[str, tuple[type, float, float]] = {
    "rate": (float, 1e-3, MAX_RATE),
    "avg_tokens": (int, 2, 10_000_000),
    "out_tokens": (int, 1, 1_000_000),
    "seed": (int, 0, 2**63),
    "max_queue": (int, 0, 1_000_000),
    "prefixes": (int, 1, 100_000),
    "prefix_share": (float, 0.0, 1.0),
}


def parse_load(text: str) -> LoadSpec | None:
    """Parse ``SGLANG_SIM_LOAD``; None when empty. ``ValueError`` names the bad item."""
    if not text.strip():
        return None
    values: dict[str, float] = {}
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in _LIMITS:
            raise ValueError(
                f"{LOAD_ENV}: {item!r} is not one of {', '.join(k + '=' for k in _LIMITS)}"
            )
        kind, low, high = _LIMITS[key]
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (low <= number <= high) or (kind is int and not number.is_integer()):
            what = "an integer" if kind is int else "a number"
            raise ValueError(
                f"{LOAD_ENV}: {key}={value.strip()!r} must be {what} in [{low:g}, {high:g}]"
            )
        values[key] = number
    missing = [k for k in ("rate", "avg_tokens") if k not in values]
    if missing:
        raise ValueError(
            f"{LOAD_ENV}={text!r} lacks {' and '.join(missing)}: give at least "
            "rate=<requests/s>,avg_tokens=<tokens per request>"
        )
    return LoadSpec(
        rate=values["rate"],
        avg_tokens=int(values["avg_tokens"]),
        out_tokens=int(values.get("out_tokens", 256)),
        seed=int(values.get("seed", 0)),
        max_queue=int(values.get("max_queue", 5000)),
        prefixes=int(values.get("prefixes", 256)),
        prefix_share=values.get("prefix_share", 0.5),
    )


class EngineStats(NamedTuple):
    running: int
    queued: int
    tokens: int
    token_usage: float
    gen_throughput: float
    cache_hit_rate: float
    generation_tokens_total: int
    prompt_tokens_total: int
    #: Whether the current decode batch replays a captured CUDA graph.
    cuda_graph: bool
    turned_away_total: int


class GenResult(NamedTuple):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    latency_s: float


@dataclass(eq=False)
class _Request:
    need: int
    prompt_tokens: int
    out_tokens: int
    #: Prefix-cache key and the prompt tokens it covers.
    key: str
    prefix_tokens: int
    synthetic: bool
    admitted: bool = False
    cached: int = 0


#: A real request's handle between ``Engine.submit`` and ``Engine.finish``.
Ticket = _Request


class Engine:
    """Admission, queueing, a prefix cache and token accounting (thread-safe).

    Real requests are submitted by their HTTP thread, which paces their tokens;
    synthetic ones live only in this object's heaps and are advanced by ``tick``.
    """

    def __init__(
        self,
        max_total_num_tokens: int,
        max_running: int,
        *,
        host_cache_tokens: int = 0,
        decode_graph_max_bs: int | None = None,
        load: LoadSpec | None = None,
        tokens_per_s: float = DECODE_TOKENS_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_total_num_tokens = max_total_num_tokens
        self.max_running = max(1, max_running)
        self.host_cache_tokens = max(0, host_cache_tokens)
        self.decode_graph_max_bs = decode_graph_max_bs
        self.load = load
        self._clock = clock
        self._cond = threading.Condition()
        self._accepting = True
        self._synthetic_stopped = False
        self.tokens_per_s = tokens_per_s
        self._pending: deque[_Request] = deque()
        self._finishing: list[tuple[float, int, _Request]] = []
        self._seq = itertools.count()
        self._running = 0
        self._real_running = 0
        self._used = 0
        self._real_inflight = 0
        self._gen_total = 0
        self._prompt_total = 0
        self._turned_away = 0
        self._window: deque[tuple[int, int]] = deque(maxlen=HIT_RATE_WINDOW)
        self._running_keys: Counter[str] = Counter()
        self._lru: OrderedDict[str, int] = OrderedDict()
        self._lru_used = 0
        self._rng = random.Random(load.seed if load else 0)
        self._next_arrival: float | None = None
        self._prefix_cum: list[float] = []
        if load is not None:
            weights = [1.0 / (k + 1) for k in range(load.prefixes)]
            self._prefix_cum = list(itertools.accumulate(weights))

    # -- lifecycle --

    def stop_synthetic(self) -> int:
        """The synthetic clients disconnect: abort their requests, stop their arrivals.
        Real requests are still accepted and served (SGLang keeps serving while it drains).

        Returns how many synthetic requests were aborted.
        """
        with self._cond:
            self._synthetic_stopped = True
            aborted = 0
            kept: deque[_Request] = deque()
            for req in self._pending:
                if req.synthetic:
                    aborted += 1
                else:
                    kept.append(req)
            self._pending = kept
            for _, _, req in self._finishing:
                self._release(req)
                aborted += 1
            self._finishing.clear()
            self._admit(self._clock())
            self._cond.notify_all()
            return aborted

    def close(self) -> int:
        """Refuse new requests and abort the synthetic ones; real ones still finish.

        Returns how many synthetic requests were aborted.
        """
        aborted = self.stop_synthetic()
        with self._cond:
            self._accepting = False
        return aborted

    def inflight(self) -> int:
        """Real requests running or queued."""
        with self._cond:
            return self._real_inflight

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no real request is running or queued; False if ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._real_inflight > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    # -- requests --

    def submit(self, prompt: str, prompt_tokens: int, max_new_tokens: int) -> Ticket | None:
        """Queue one real request (FIFO behind the others); None when the engine no longer
        accepts any. The caller waits with ``wait_admitted`` and ends with ``finish``."""
        key = "p:" + hashlib.blake2b(prompt.encode(), digest_size=16).hexdigest()
        req = _Request(
            need=prompt_tokens + max_new_tokens,
            prompt_tokens=prompt_tokens,
            out_tokens=max_new_tokens,
            key=key,
            prefix_tokens=prompt_tokens,
            synthetic=False,
        )
        with self._cond:
            if not self._accepting:
                return None
            self._real_inflight += 1
            self._pending.append(req)
            self._admit(self._clock())
        return req

    def wait_admitted(self, req: Ticket) -> None:
        """Block until ``req`` runs (every finish and tick re-runs admission)."""
        with self._cond:
            while not req.admitted:
                self._cond.wait(1.0)

    def prefill_s(self, req: Ticket) -> float:
        """Time to the first token of an admitted request (its uncached prompt)."""
        return (req.prompt_tokens - req.cached) / PREFILL_TOKENS_PER_S

    def finish(self, req: Ticket, generated: int) -> None:
        """``req`` ended (done, or its client went away) after ``generated`` tokens."""
        with self._cond:
            if req.admitted:
                self._release(req)
            else:
                self._pending.remove(req)
            self._gen_total += generated
            self._real_inflight -= 1
            self._admit(self._clock())
            self._cond.notify_all()

    def generate(self, prompt: str, prompt_tokens: int, max_new_tokens: int) -> GenResult | None:
        """Run one real request to completion; None when the engine no longer accepts any."""
        start = self._clock()
        req = self.submit(prompt, prompt_tokens, max_new_tokens)
        if req is None:
            return None
        try:
            self.wait_admitted(req)
            time.sleep(self.prefill_s(req) + max_new_tokens / self.tokens_per_s)
        finally:
            self.finish(req, max_new_tokens)
        return GenResult(prompt_tokens, max_new_tokens, req.cached, self._clock() - start)

    def tick(self, now: float | None = None) -> None:
        """Synthetic arrivals and completions up to ``now``, then admission."""
        now = self._clock() if now is None else now
        with self._cond:
            if self.load is not None and self._accepting and not self._synthetic_stopped:
                self._arrivals(now)
            while self._finishing and self._finishing[0][0] <= now:
                _, _, req = heapq.heappop(self._finishing)
                self._release(req)
                self._gen_total += req.out_tokens
            self._admit(now)

    def stats(self) -> EngineStats:
        with self._cond:
            cap = self.max_total_num_tokens
            usage = self._used / cap if cap else 0.0
            prompt = sum(p for p, _ in self._window)
            cached = sum(c for _, c in self._window)
            graph = self.decode_graph_max_bs is not None and self._running <= (
                self.decode_graph_max_bs
            )
            return EngineStats(
                running=self._running,
                queued=len(self._pending),
                tokens=self._used,
                token_usage=min(1.0, usage),
                gen_throughput=(self._running - self._real_running) * DECODE_TOKENS_PER_S
                + self._real_running * self.tokens_per_s,
                cache_hit_rate=cached / prompt if prompt else 0.0,
                generation_tokens_total=self._gen_total,
                prompt_tokens_total=self._prompt_total,
                cuda_graph=graph,
                turned_away_total=self._turned_away,
            )

    # -- internals (the lock is held) --

    def _arrivals(self, now: float) -> None:
        load = self.load
        assert load is not None
        if self._next_arrival is None:
            self._next_arrival = now + self._rng.expovariate(load.rate)
        if now - self._next_arrival > MAX_CATCH_UP_S:
            self._next_arrival = now - MAX_CATCH_UP_S
        while self._next_arrival <= now:
            self._next_arrival += self._rng.expovariate(load.rate)
            if len(self._pending) >= load.max_queue:
                self._turned_away += 1
                continue
            self._pending.append(self._synthetic(load))

    def _synthetic(self, load: LoadSpec) -> _Request:
        need = max(2, int(load.avg_tokens * self._rng.uniform(0.5, 1.5)))
        out = max(1, min(load.out_tokens, need // 2))
        prompt = need - out
        prefix = self._rng.choices(range(load.prefixes), cum_weights=self._prefix_cum)[0]
        return _Request(
            need=need,
            prompt_tokens=prompt,
            out_tokens=out,
            key=f"s:{prefix}",
            prefix_tokens=min(prompt, int(load.prefix_share * load.avg_tokens)),
            synthetic=True,
        )

    def _admit(self, now: float) -> None:
        """First come, first served, while a slot is free and the head's tokens fit."""
        woke = False
        while self._pending:
            req = self._pending[0]
            if self._running >= self.max_running:
                break
            if self._running > 0 and self._used + req.need > self.max_total_num_tokens:
                break
            self._pending.popleft()
            self._running += 1
            self._real_running += 0 if req.synthetic else 1
            self._used += req.need
            req.cached = self._lookup(req)
            req.admitted = True
            self._prompt_total += req.prompt_tokens
            self._window.append((req.prompt_tokens, req.cached))
            if req.synthetic:
                heapq.heappush(self._finishing, (now + self._duration(req), next(self._seq), req))
            else:
                woke = True
        if woke:
            self._cond.notify_all()

    def _release(self, req: _Request) -> None:
        self._running -= 1
        self._real_running -= 0 if req.synthetic else 1
        self._used -= req.need
        self._running_keys[req.key] -= 1
        if self._running_keys[req.key] <= 0:
            del self._running_keys[req.key]

    def _lookup(self, req: _Request) -> int:
        """Cached prompt tokens of ``req``; then mark its key in use and remember it (LRU
        within the free device pool plus the host pool)."""
        hit = self._running_keys[req.key] > 0 or req.key in self._lru
        self._running_keys[req.key] += 1
        if req.key in self._lru:
            self._lru.move_to_end(req.key)
        else:
            self._lru[req.key] = req.prefix_tokens
            self._lru_used += req.prefix_tokens
        room = max(0, self.max_total_num_tokens - self._used) + self.host_cache_tokens
        while self._lru_used > room and self._lru:
            _, size = self._lru.popitem(last=False)
            self._lru_used -= size
        return req.prefix_tokens if hit else 0

    @staticmethod
    def _duration(req: _Request) -> float:
        """A synthetic request's lifetime (real ones are paced by their HTTP thread)."""
        prefill = (req.prompt_tokens - req.cached) / PREFILL_TOKENS_PER_S
        return prefill + req.out_tokens / DECODE_TOKENS_PER_S
