"""The simulated server's engine: KV-bound admission, a FIFO queue, a prefix cache, and a
built-in synthetic workload; one scheduler per DP worker.

Every request — a real ``/generate`` or a synthetic one — needs KV tokens for its prompt
and its output. It is admitted, first come first served, while fewer than
``max_running`` requests run and its tokens fit the KV pool (``max_total_num_tokens``);
otherwise it waits, and so does everything behind it (SGLang's scheduler stops at the
first request it cannot fit). So running requests, the queue, token usage and throughput
move the way they do on a KV-bound SGLang: more KV tokens per GPU (a higher
``mem_fraction_static``, an fp8 KV cache) let more requests run at once.

With attention DP (or DP replicas) SGLang runs one scheduler per DP worker, each with its
own waiting queue, its own KV pool of ``max_total_num_tokens`` tokens, its own radix cache
and its share of ``max_running_requests``; the DP controller hands requests out round
robin (``load_balance_method`` ``auto`` resolves to ``round_robin`` outside PD
disaggregation: ``arg_groups/serving_hook.py:222-234``,
``managers/data_parallel_controller.py:880-899``). The engine does the same; ``stats()``
sums the workers and ``worker_stats()`` gives each one, as each worker's scheduler exports
its own series.

A prefill forward takes at most ``prefill_batch_tokens`` new tokens (the chunk); when the
uncached prompt tokens a worker admits in one step (capped at the chunk) exceed
``prefill_limit_tokens`` — what ``mem_fraction_static`` leaves for activations
(``sglang_supervisor.sim.capacity.prefill_limit_tokens``) — the prefill runs out of memory:
admission stops and ``prefill_oom`` holds the tokens, for the launcher to crash on.

The prefix cache (``sim.prefixcache``: what it keeps and evicts, and SGLang's counters)
holds running requests' prompts or shared prefixes and, LRU, what finished ones left in
the free device pool, then the host pool. A hit skips that part of the prefill. The host
pool raises the hit rate; it never admits more requests (admission counts device tokens).

``SGLANG_SIM_LOAD=rate=R,avg_tokens=T[,out_tokens=O][,seed=S][,max_queue=Q]
[,prefixes=N][,prefix_share=F]``: requests arrive as a Poisson process at R per second
(R ≤ 2000) from the server's first ``/health_generate`` 200 (its clients send work only to
a server seen healthy); each needs ~T KV tokens (uniform in [T/2, 3T/2], deterministic for
a seed), of which O (default 256, at most half) are
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
import random
import threading
import time
from collections import deque
from collections.abc import Callable

from sglang_supervisor.sim.scheduler import EngineStats, GenResult, Ticket, _Worker
from sglang_supervisor.sim.workload import (
    DECODE_TOKENS_PER_S,
    LOAD_ENV,
    MAX_CATCH_UP_S,
    PREFILL_TOKENS_PER_S,
    LoadSpec,
    Request,
    parse_load,
    synthetic,
)

__all__ = ["DECODE_TOKENS_PER_S", "LOAD_ENV", "Engine", "EngineStats", "LoadSpec", "parse_load"]


class Engine:
    """Admission, queueing, a prefix cache and token accounting (thread-safe), per DP
    worker (``workers``; ``max_total_num_tokens`` and ``max_running`` are each worker's).

    Real requests are submitted by their HTTP thread, which paces their tokens;
    synthetic ones live only in this object's heaps and are advanced by ``tick``.
    """

    def __init__(
        self,
        max_total_num_tokens: int,
        max_running: int,
        *,
        workers: int = 1,
        host_cache_tokens: int = 0,
        decode_graph_max_bs: int | None = None,
        load: LoadSpec | None = None,
        tokens_per_s: float = DECODE_TOKENS_PER_S,
        prefill_batch_tokens: int | None = None,
        prefill_limit_tokens: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_total_num_tokens = max_total_num_tokens
        self.max_running = max(1, max_running)
        self.host_cache_tokens = max(0, host_cache_tokens)
        self.decode_graph_max_bs = decode_graph_max_bs
        self.load = load
        self.prefill_batch_tokens = prefill_batch_tokens
        self.prefill_limit_tokens = prefill_limit_tokens
        #: The prefill (tokens) that ran out of activation memory; None while none did.
        self.prefill_oom: int | None = None
        self._clock = clock
        self._cond = threading.Condition()
        self._accepting = True
        self._synthetic_stopped = False
        self.tokens_per_s = tokens_per_s
        self.workers = [_Worker(self.host_cache_tokens) for _ in range(max(1, workers))]
        self._next_worker = 0
        self._finishing: list[tuple[float, int, Request]] = []
        self._seq = itertools.count()
        self._real_inflight = 0
        self._turned_away = 0
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
            for w in self.workers:
                kept = deque(r for r in w.pending if not r.synthetic)
                aborted += len(w.pending) - len(kept)
                w.pending = kept
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
        """Queue one real request (FIFO behind the others on its worker); None when the
        engine no longer accepts any. The caller waits with ``wait_admitted`` and ends with
        ``finish``."""
        key = "p:" + hashlib.blake2b(prompt.encode(), digest_size=16).hexdigest()
        req = Request(
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
            req.arrived = self._clock()
            self._dispatch(req)
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
            w = self.workers[req.worker]
            if req.admitted:
                self._release(req)
            else:
                w.pending.remove(req)
            w.gen_total += generated
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
                self.workers[req.worker].gen_total += req.out_tokens
            self._admit(now)

    def stats(self) -> EngineStats:
        """The whole server: the workers' figures summed (token usage over all pools)."""
        parts = self.worker_stats()
        running = sum(p.running for p in parts)
        used = sum(p.tokens for p in parts)
        cap = self.max_total_num_tokens * len(parts)
        with self._cond:
            prompt = sum(p for w in self.workers for p, _ in w.window)
            cached = sum(c for w in self.workers for _, c in w.window)
        return EngineStats(
            running=running,
            queued=sum(p.queued for p in parts),
            tokens=used,
            token_usage=min(1.0, used / cap) if cap else 0.0,
            gen_throughput=sum(p.gen_throughput for p in parts),
            cache_hit_rate=cached / prompt if prompt else 0.0,
            generation_tokens_total=sum(p.generation_tokens_total for p in parts),
            prompt_tokens_total=sum(p.prompt_tokens_total for p in parts),
            cuda_graph=all(p.cuda_graph for p in parts),
            turned_away_total=self._turned_away,
            ttft_sum_s=sum(p.ttft_sum_s for p in parts),
            ttft_count=sum(p.ttft_count for p in parts),
            evicted_tokens_total=sum(p.evicted_tokens_total for p in parts),
            evictable_tokens=sum(p.evictable_tokens for p in parts),
            cached_device_tokens_total=sum(p.cached_device_tokens_total for p in parts),
            cached_host_tokens_total=sum(p.cached_host_tokens_total for p in parts),
            load_back_tokens_total=sum(p.load_back_tokens_total for p in parts),
            host_used_tokens=sum(p.host_used_tokens for p in parts),
            host_total_tokens=sum(p.host_total_tokens for p in parts),
        )

    def worker_stats(self) -> list[EngineStats]:
        """Each DP worker's figures, as its scheduler reports them."""
        with self._cond:
            return [self._worker_stats(w) for w in self.workers]

    # -- internals (the lock is held) --

    def _worker_stats(self, w: _Worker) -> EngineStats:
        cap = self.max_total_num_tokens
        prompt = sum(p for p, _ in w.window)
        cached = sum(c for _, c in w.window)
        graph = self.decode_graph_max_bs is not None and w.running <= self.decode_graph_max_bs
        return EngineStats(
            running=w.running,
            queued=len(w.pending),
            tokens=w.used,
            token_usage=min(1.0, w.used / cap) if cap else 0.0,
            gen_throughput=(w.running - w.real_running) * DECODE_TOKENS_PER_S
            + w.real_running * self.tokens_per_s,
            cache_hit_rate=cached / prompt if prompt else 0.0,
            generation_tokens_total=w.gen_total,
            prompt_tokens_total=w.prompt_total,
            cuda_graph=graph,
            turned_away_total=self._turned_away,
            ttft_sum_s=w.ttft_sum_s,
            ttft_count=w.ttft_count,
            evicted_tokens_total=w.cache.evicted_total,
            evictable_tokens=w.cache.device_used,
            cached_device_tokens_total=w.cache.cached_device_total,
            cached_host_tokens_total=w.cache.cached_host_total,
            load_back_tokens_total=w.cache.load_back_total,
            host_used_tokens=w.cache.host_used,
            host_total_tokens=w.cache.host_tokens,
        )

    def _dispatch(self, req: Request) -> None:
        """Round robin over the DP workers, as SGLang's DP controller does."""
        req.worker = self._next_worker
        self._next_worker = (self._next_worker + 1) % len(self.workers)
        self.workers[req.worker].pending.append(req)

    def _arrivals(self, now: float) -> None:
        load = self.load
        assert load is not None
        if self._next_arrival is None:
            self._next_arrival = now + self._rng.expovariate(load.rate)
        if now - self._next_arrival > MAX_CATCH_UP_S:
            self._next_arrival = now - MAX_CATCH_UP_S
        while self._next_arrival <= now:
            arrived = self._next_arrival
            self._next_arrival += self._rng.expovariate(load.rate)
            if sum(len(w.pending) for w in self.workers) >= load.max_queue:
                self._turned_away += 1
                continue
            req = synthetic(load, self._rng, self._prefix_cum)
            req.arrived = arrived
            self._dispatch(req)

    def _admit(self, now: float) -> None:
        """Per worker, first come first served, while a slot is free and the head's
        tokens fit; the step's prefill must fit the activation memory."""
        woke = False
        for w in self.workers:
            if self.prefill_oom is not None:
                break
            prefill = 0
            while w.pending:
                req = w.pending[0]
                if w.running >= self.max_running:
                    break
                if w.running > 0 and w.used + req.need > self.max_total_num_tokens:
                    break
                new = req.prompt_tokens - (req.prefix_tokens if w.hit(req) else 0)
                prefill += new
                batch = prefill
                if self.prefill_batch_tokens is not None:
                    batch = min(batch, self.prefill_batch_tokens)
                if self.prefill_limit_tokens is not None and batch > self.prefill_limit_tokens:
                    self.prefill_oom = batch
                    break
                w.pending.popleft()
                w.running += 1
                w.real_running += 0 if req.synthetic else 1
                w.used += req.need
                req.cached = self._lookup(w, req)
                req.admitted = True
                w.prompt_total += req.prompt_tokens
                w.window.append((req.prompt_tokens, req.cached))
                # Time to first token: the wait in the queue, then the uncached prefill.
                w.ttft_sum_s += max(0.0, now - req.arrived) + self.prefill_s(req)
                w.ttft_count += 1
                if req.synthetic:
                    end = now + self._duration(req)
                    heapq.heappush(self._finishing, (end, next(self._seq), req))
                else:
                    woke = True
        if woke:
            self._cond.notify_all()

    def _release(self, req: Request) -> None:
        w = self.workers[req.worker]
        w.running -= 1
        w.real_running -= 0 if req.synthetic else 1
        w.used -= req.need
        w.running_keys[req.key] -= 1
        if w.running_keys[req.key] <= 0:
            del w.running_keys[req.key]
        # Its own KV stays in the radix tree, evictable: never reused, it only takes room.
        rest = req.need - req.prefix_tokens
        if rest > 0:
            w.cache.insert(f"u:{next(self._seq)}", rest, self.max_total_num_tokens - w.used)

    def _lookup(self, w: _Worker, req: Request) -> int:
        """Cached prompt tokens of ``req``; then mark its key in use and remember it (LRU:
        the worker's free device pool, then the host pool)."""
        source = "device" if w.running_keys[req.key] > 0 else w.cache.where(req.key)
        w.running_keys[req.key] += 1
        if req.prefix_tokens > 0:
            w.cache.insert(req.key, req.prefix_tokens, self.max_total_num_tokens - w.used)
        if source is None:
            return 0
        w.cache.served(source, req.prefix_tokens)
        return req.prefix_tokens

    @staticmethod
    def _duration(req: Request) -> float:
        """A synthetic request's lifetime (real ones are paced by their HTTP thread)."""
        prefill = (req.prompt_tokens - req.cached) / PREFILL_TOKENS_PER_S
        return prefill + req.out_tokens / DECODE_TOKENS_PER_S
