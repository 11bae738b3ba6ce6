"""The simulated server's engine: SGLang's scheduling loop over a KV pool, a FIFO queue, a
prefix cache and a built-in synthetic workload; one scheduler per DP worker.

Each worker runs SGLang 0.5.23's event loop (``srt/managers/scheduler.py``
``get_next_batch_to_run``), one forward pass at a time, each decided when the last one
ends: a **prefill** whenever a request can be admitted, else a **decode** step of the
running batch. Admission (``srt/managers/schedule_policy.py`` ``PrefillAdder``), first come
first served: a request joins while fewer than ``max_running`` run and its uncached prompt
plus its (clipped) output fits what is left of the pool once the running requests'
outputs to come are kept back at ``new_token_ratio`` (0.7 × ``--schedule-conservativeness``
at first, decaying each decode step to 0.14 of that); a pass takes at most the chunk
(``--chunked-prefill-size``) of prompt tokens, a longer prompt being prefilled a chunk
at a time. A decode step adds one token to every running request; when the pool cannot
hold the next token the newest requests are **retracted** (freed, back to the queue,
their output so far prefilled again later) and the ratio re-estimated
(``srt/managers/schedule_batch.py`` ``retract_decode``). A decode step costs
``1 / SGLANG_SIM_TOKENS_PER_S`` whatever the batch, more past the captured CUDA graphs
(``sim.scheduler.Speeds``); a prefill pass costs a fixed 0.5 ms and its tokens at
``SGLANG_SIM_PREFILL_TOKENS_PER_S``. So throughput, running and queued requests, token usage,
time to first token and the inter-token latency follow the levers through SGLang's
mechanics: more KV tokens per GPU let more requests decode at once; a smaller
``max_running_requests`` or chunk, or more conservative scheduling, cost throughput.

With attention DP (or DP replicas) SGLang runs one scheduler per DP worker, each with its
own waiting queue, its own KV pool of ``max_total_num_tokens`` tokens, its own radix cache
and its share of ``max_running_requests``; the DP controller hands requests out round
robin (``load_balance_method`` ``auto`` resolves to ``round_robin`` outside PD
disaggregation: ``arg_groups/serving_hook.py:222-234``,
``managers/data_parallel_controller.py:880-899``). The engine does the same; ``stats()``
sums the workers and ``worker_stats()`` gives each one, as each worker's scheduler exports
its own series.

When the prompt tokens one prefill pass takes exceed ``prefill_limit_tokens`` — what
``mem_fraction_static`` leaves for activations
(``sglang_supervisor.sim.capacity.prefill_limit_tokens``) — the prefill runs out of memory:
admission stops and ``prefill_oom`` holds the tokens, for the launcher to crash on.

The prefix cache (``sim.prefixcache``: what it keeps and evicts, and SGLang's counters)
holds running requests' prompts or shared prefixes and, LRU, what finished ones left in
the free device pool, then the host pool. A hit skips that part of the prefill. The host
pool raises the hit rate; it never admits more requests (admission counts device tokens).

``SGLANG_SIM_LOAD`` (``sim.workload``) is an open-loop synthetic load: Poisson arrivals
whatever the server's speed, from the server's first ``/health_generate`` 200 on (its
clients send work only to a server seen healthy: ``sim.lifecycle``). Real requests
(``/generate``...) are submitted by their HTTP thread, which waits for their tokens as
the decode steps make them. At SIGTERM the synthetic clients disconnect: their requests
are aborted at once, while real requests are still accepted and drain. All the
bookkeeping runs under one lock, advanced to the
present by ``tick()`` (every 0.1 s) and by the HTTP threads waiting for a token.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import threading
import time
from collections.abc import Callable

from sglang_supervisor.sim.passes import Passes
from sglang_supervisor.sim.scheduler import (
    INIT_NEW_TOKEN_RATIO,
    EngineStats,
    GenResult,
    Speeds,
    Ticket,
    _Worker,
)
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
    """SGLang's scheduling loop, per DP worker (``workers``; ``max_total_num_tokens`` and
    ``max_running`` are each worker's), thread-safe."""

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
        prefill_tokens_per_s: float = PREFILL_TOKENS_PER_S,
        schedule_conservativeness: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_total_num_tokens = max_total_num_tokens
        self.max_running = max(1, max_running)
        self.host_cache_tokens = max(0, host_cache_tokens)
        self.decode_graph_max_bs = decode_graph_max_bs
        self.load = load
        self.prefill_batch_tokens = prefill_batch_tokens
        self.prefill_limit_tokens = prefill_limit_tokens
        self.speeds = Speeds(1.0 / tokens_per_s, decode_graph_max_bs, prefill_tokens_per_s)
        self._passes = Passes(
            max_total_num_tokens,
            self.max_running,
            self.speeds,
            prefill_batch_tokens,
            prefill_limit_tokens,
            self._lookup,
        )
        self._clock = clock
        self._cond = threading.Condition()
        self._accepting = True
        self._synthetic_stopped = False
        self.tokens_per_s = tokens_per_s
        ratio = INIT_NEW_TOKEN_RATIO * schedule_conservativeness
        self.workers = [_Worker(ratio, self.host_cache_tokens) for _ in range(max(1, workers))]
        self._next_worker = 0
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
                queued = sum(1 for r in w.pending if r.synthetic)
                w.pending = type(w.pending)(r for r in w.pending if not r.synthetic)
                w.requests_total += queued
                w.aborted_total += queued
                doomed = [r for r in w.running.values() if r.synthetic]
                if w.step is not None:
                    doomed += [r for r, _ in w.step.prefill if r.synthetic and not r.ended]
                if w.chunked is not None and w.chunked.synthetic and w.chunked not in doomed:
                    doomed.append(w.chunked)
                for req in doomed:
                    self._passes.end(w, req, aborted=True)
                aborted += queued + len(doomed)
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
                self._cond.wait(min(left, 0.05))
                self._advance(self._clock())
        return True

    # -- requests --

    def submit(self, prompt: str, prompt_tokens: int, max_new_tokens: int) -> Ticket | None:
        """Queue one real request (FIFO behind the others on its worker); None when the
        engine no longer accepts any. The caller takes its tokens with ``wait_tokens``
        and ends with ``finish``."""
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
            now = self._clock()
            self._advance(now)
            req.arrived = now
            self._dispatch(req)
            self._advance(now)
        return req

    def wait_tokens(self, req: Ticket, seen: int, timeout_s: float = 1.0) -> tuple[int, bool]:
        """Block until ``req`` has more than ``seen`` tokens or has ended (at most
        ``timeout_s``); returns its tokens so far and whether it ended. The waiting
        thread advances the engine itself at each step's end, so tokens come when the
        decode steps make them, not at the next tick."""
        w = self.workers[req.worker]
        deadline = self._clock() + timeout_s
        with self._cond:
            while True:
                now = self._clock()
                self._advance(now)
                got = w.generated_by(req)
                if got > seen or req.ended or now >= deadline:
                    return got, req.ended
                step_end = w.step.end if w.step is not None else now + 0.05
                self._cond.wait(min(max(0.001, step_end - now), deadline - now, 0.1))

    def finish(self, req: Ticket, generated: int | None = None) -> None:
        """``req``'s client is done with it (its answer sent, or it went away): a request
        still in the engine is aborted, as SGLang aborts a disconnected request."""
        with self._cond:
            if not req.ended:
                self._passes.end(self.workers[req.worker], req, aborted=True)
            self._real_inflight -= 1
            self._advance(self._clock())
            self._cond.notify_all()

    def generate(self, prompt: str, prompt_tokens: int, max_new_tokens: int) -> GenResult | None:
        """Run one real request to completion; None when the engine no longer accepts any."""
        start = self._clock()
        req = self.submit(prompt, prompt_tokens, max_new_tokens)
        if req is None:
            return None
        try:
            got, ended = 0, False
            while not ended:
                got, ended = self.wait_tokens(req, got)
        finally:
            self.finish(req)
        return GenResult(prompt_tokens, got, req.cached, self._clock() - start)

    def tick(self, now: float | None = None) -> None:
        """Synthetic arrivals up to ``now``, then every worker's passes up to ``now``."""
        now = self._clock() if now is None else now
        with self._cond:
            if self.load is not None and self._accepting and not self._synthetic_stopped:
                self._arrivals(now)
            self._advance(now)

    def stats(self) -> EngineStats:
        """The whole server: the workers' figures summed (token usage over all pools)."""
        parts = self.worker_stats()
        used = sum(p.tokens for p in parts)
        cap = self.max_total_num_tokens * len(parts)
        with self._cond:
            prompt = sum(p for w in self.workers for p, _ in w.window)
            cached = sum(c for w in self.workers for _, c in w.window)
        return EngineStats(
            running=sum(p.running for p in parts),
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
            itl_sum_s=sum(p.itl_sum_s for p in parts),
            itl_count=sum(p.itl_count for p in parts),
            requests_total=sum(p.requests_total for p in parts) + self._turned_away,
            aborted_total=sum(p.aborted_total for p in parts) + self._turned_away,
            retracted_total=sum(p.retracted_total for p in parts),
            new_token_ratio=max(p.new_token_ratio for p in parts),
        )

    def worker_stats(self) -> list[EngineStats]:
        """Each DP worker's figures, as its scheduler reports them."""
        with self._cond:
            return [self._worker_stats(w) for w in self.workers]

    @property
    def prefill_oom(self) -> int | None:
        """The prefill (tokens) that ran out of activation memory; None while none did."""
        return self._passes.prefill_oom

    # -- internals (the lock is held) --

    def _advance(self, now: float) -> None:
        if self._passes.advance(self.workers, now):
            self._cond.notify_all()

    def _worker_stats(self, w: _Worker) -> EngineStats:
        cap = self.max_total_num_tokens
        prompt = sum(p for p, _ in w.window)
        cached = sum(c for _, c in w.window)
        graph = self.decode_graph_max_bs is not None and len(w.running) <= self.decode_graph_max_bs
        used = w.used
        return EngineStats(
            running=w.running_count,
            queued=len(w.pending),
            tokens=used,
            token_usage=min(1.0, used / cap) if cap else 0.0,
            gen_throughput=0.0 if w.clock is None else w.gen_throughput(w.clock),
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
            itl_sum_s=w.itl_sum_s,
            itl_count=w.itl_count,
            requests_total=w.requests_total,
            aborted_total=w.aborted_total,
            retracted_total=w.retracted_total,
            new_token_ratio=w.new_token_ratio,
        )

    def _dispatch(self, req: Request) -> None:
        """Round robin over the DP workers, as SGLang's DP controller does."""
        req.seq = next(self._seq)
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
