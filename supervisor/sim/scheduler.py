"""One DP worker's scheduler state in the simulated load (``_Worker``: its waiting queue,
running batch, KV pool, radix cache, the step in flight and its counters), the cost of a
forward pass (``Speeds``), and what the load engine reports (``EngineStats`` per worker or
summed, ``GenResult`` per request, ``Ticket`` between submit and finish).

The constants are SGLang 0.5.23's: the admission estimate of the output a running request
still needs (``new_token_ratio``: ``srt/environ.py:646-650``, its decay per decode step and
its re-estimate after a retraction in
``srt/managers/scheduler_components/new_token_ratio_tracker.py``), and the clip on a
request's output in that estimate (``srt/managers/schedule_policy.py:89``).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, deque
from dataclasses import dataclass
from typing import NamedTuple

from sglang_supervisor.sim.prefixcache import PrefixCache
from sglang_supervisor.sim.workload import HIT_RATE_WINDOW, PREFILL_TOKENS_PER_S, Request

#: ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``: a request's output counts at most this much
#: in the admission estimate (schedule_policy.py:89).
CLIP_MAX_NEW_TOKENS = 4096
#: ``SGLANG_INIT_NEW_TOKEN_RATIO`` (× ``--schedule-conservativeness``), the floor factor,
#: and the decode steps the ratio takes to decay to its floor (environ.py:646-648).
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
#: ``SGLANG_RETRACT_DECODE_STEPS``: the ratio after a retraction counts this many more
#: steps for every request left (environ.py:649).
RETRACT_DECODE_STEPS = 20
#: A decode batch larger than the captured CUDA graphs runs eagerly: this much slower.
EAGER_STEP_FACTOR = 1.25
#: The fixed cost of a prefill forward pass (seconds), beside its tokens (as fast, next to
#: a real one, as the default prefill rate).
PREFILL_STEP_S = 0.0005
#: ``sglang:gen_throughput`` covers the decode steps of this many seconds.
GEN_WINDOW_S = 2.0


@dataclass(frozen=True)
class Speeds:
    """What a forward pass costs on this simulated server."""

    #: One decode step (seconds): one token per request, whatever the batch (decode of
    #: the batches a KV pool holds is bound by reading the weights).
    decode_step_s: float
    #: The largest decode batch a captured CUDA graph replays (None: graphs off).
    graph_max_bs: int | None = None
    #: Prompt tokens a prefill pass processes per second.
    prefill_tokens_per_s: float = PREFILL_TOKENS_PER_S

    def decode_s(self, batch: int) -> float:
        """One decode step of ``batch`` requests: slower past the captured graphs."""
        step = self.decode_step_s
        if self.graph_max_bs is None or batch > self.graph_max_bs:
            step *= EAGER_STEP_FACTOR
        return step

    def prefill_s(self, tokens: int) -> float:
        """One prefill pass of ``tokens`` prompt tokens."""
        return PREFILL_STEP_S + tokens / self.prefill_tokens_per_s


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
    #: Time to first token of every admitted request: seconds summed, and how many.
    ttft_sum_s: float = 0.0
    ttft_count: int = 0
    #: The radix cache (``sim.prefixcache``): device tokens freed by eviction, cached
    #: tokens now evictable on the device, prompt tokens served from each tier, tokens
    #: loaded back from the host tier, and the host tier's use and size.
    evicted_tokens_total: int = 0
    evictable_tokens: int = 0
    cached_device_tokens_total: int = 0
    cached_host_tokens_total: int = 0
    load_back_tokens_total: int = 0
    host_used_tokens: int = 0
    host_total_tokens: int = 0
    #: Inter-token latency: seconds between tokens summed, and how many tokens.
    itl_sum_s: float = 0.0
    itl_count: int = 0
    #: Requests that ended (finished or aborted, turned away included), and the aborted.
    requests_total: int = 0
    aborted_total: int = 0
    #: Requests retracted from the decode batch when the KV pool ran out.
    retracted_total: int = 0
    new_token_ratio: float = INIT_NEW_TOKEN_RATIO


class GenResult(NamedTuple):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    latency_s: float


#: A real request's handle between ``Engine.submit`` and ``Engine.finish``.
Ticket = Request


@dataclass
class Step:
    """The forward pass in flight: decided at ``start``, its effects applied at ``end``."""

    start: float
    end: float
    #: A prefill: (request, tokens of its prompt this pass prefills).
    prefill: list[tuple[Request, int]]
    #: A decode: how many steps, and how many requests decode in each.
    decode_steps: int = 0
    batch: int = 0


class _Worker:
    """One DP worker's scheduler: its queue, running batch, KV pool, radix cache and
    counters. ``used`` KV tokens are the prompts of the running requests, their outputs
    so far and the prompt a chunked request has prefilled."""

    def __init__(self, ratio: float = INIT_NEW_TOKEN_RATIO, host_cache_tokens: int = 0) -> None:
        self.pending: deque[Request] = deque()
        #: Decoding requests in the order they joined the batch (a retraction takes the
        #: newest: SGLang keeps the ones that generated most).
        self.running: dict[int, Request] = {}
        #: The request whose prompt is prefilled a chunk at a time (SGLang's chunked_req).
        self.chunked: Request | None = None
        #: Finishing order of the decoding requests: (step of their last token, seq, req).
        self.finishing: list[tuple[int, int, Request]] = []
        self.step: Step | None = None
        #: The worker's simulated time (None: not started).
        self.clock: float | None = None
        #: Decode steps run so far: a decoding request has ``steps - req.s0`` tokens.
        self.steps = 0
        self.last_decode_end: float | None = None
        self._seq = itertools.count()
        # Sums over the decoding requests, so that KV and the estimate cost O(1).
        self._prompt_sum = 0
        self._s0_sum = 0
        self._out_sum = 0
        self.prefilling = 0
        self.ratio_init = min(1.0, ratio)
        self.ratio_min = self.ratio_init * MIN_NEW_TOKEN_RATIO_FACTOR
        self.new_token_ratio = self.ratio_init
        self.real_running = 0
        self.gen_total = 0
        self.prompt_total = 0
        self.ttft_sum_s = 0.0
        self.ttft_count = 0
        self.itl_sum_s = 0.0
        self.itl_count = 0
        self.requests_total = 0
        self.aborted_total = 0
        self.retracted_total = 0
        #: (end of a decode pass, tokens it generated) over the last ``GEN_WINDOW_S``.
        self.generated: deque[tuple[float, int]] = deque(maxlen=8192)
        self.window: deque[tuple[int, int]] = deque(maxlen=HIT_RATE_WINDOW)
        self.running_keys: Counter[str] = Counter()
        #: The radix cache: device and host tiers, SGLang's eviction counters.
        self.cache = PrefixCache(host_cache_tokens)

    def hit(self, req: Request) -> bool:
        return self.running_keys[req.key] > 0 or self.cache.where(req.key) is not None

    # -- the decode batch --

    @property
    def used(self) -> int:
        decoding = self._prompt_sum + len(self.running) * self.steps - self._s0_sum
        return decoding + self.prefilling

    @property
    def running_count(self) -> int:
        """Requests admitted and not ended: decoding, prefilling, chunked."""
        step = self.step
        admitted = (
            sum(1 for r, _ in step.prefill if r is not self.chunked and not r.ended) if step else 0
        )
        return len(self.running) + admitted + (self.chunked is not None)

    def reserved(self) -> float:
        """What admission keeps back for the running requests' outputs to come:
        ``new_token_ratio`` × their remaining output (clipped), as
        ``PrefillAdder._get_running_request_total_token_offset`` does."""
        left = self._out_sum - (len(self.running) * self.steps - self._s0_sum)
        return self.new_token_ratio * max(0, left)

    def generated_by(self, req: Request) -> int:
        return self.steps - req.s0 if req.s0 is not None else req.done_out

    def start_decoding(self, req: Request, generated: int) -> None:
        """``req`` joins the decode batch with ``generated`` tokens (its prefill's first)."""
        req.s0 = self.steps - generated
        self.running[req.seq] = req
        self._prompt_sum += req.prompt_tokens
        self._s0_sum += req.s0
        self._out_sum += min(req.out_tokens, CLIP_MAX_NEW_TOKENS)
        heapq.heappush(self.finishing, (req.s0 + req.out_tokens, next(self._seq), req))

    def stop_decoding(self, req: Request) -> int:
        """``req`` leaves the decode batch (finished, aborted, retracted); returns the
        tokens it had generated. Its entry in ``finishing`` is dropped lazily."""
        assert req.s0 is not None
        generated = self.steps - req.s0
        del self.running[req.seq]
        self._prompt_sum -= req.prompt_tokens
        self._s0_sum -= req.s0
        self._out_sum -= min(req.out_tokens, CLIP_MAX_NEW_TOKENS)
        req.s0 = None
        req.done_out = generated
        return generated

    def next_finish(self) -> int | None:
        """Decode steps until the next request's last token."""
        while self.finishing and self.finishing[0][2].seq not in self.running:
            heapq.heappop(self.finishing)
        if not self.finishing:
            return None
        return max(1, self.finishing[0][0] - self.steps)

    def finished_now(self) -> list[Request]:
        """The decoding requests whose last token the steps so far produced."""
        done = []
        while self.finishing and self.finishing[0][0] <= self.steps:
            _, _, req = heapq.heappop(self.finishing)
            if req.seq in self.running and req.s0 is not None:
                done.append(req)
        return done

    def newest(self) -> Request:
        return self.running[next(reversed(self.running))]

    def decay_ratio(self, steps: int) -> None:
        decay = (self.ratio_init - self.ratio_min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = max(self.ratio_min, self.new_token_ratio - decay * steps)

    def ratio_after_retract(self) -> None:
        """``estimate_new_token_ratio_after_retract`` over the requests left."""
        n = len(self.running)
        decoded = n * self.steps - self._s0_sum
        total = sum(r.out_tokens for r in self.running.values())
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * n) / (total + 1))

    def gen_throughput(self, now: float) -> float:
        """Tokens generated per second over the last ``GEN_WINDOW_S`` (SGLang's gauge
        covers its last logging interval of decode steps)."""
        while self.generated and self.generated[0][0] < now - GEN_WINDOW_S:
            self.generated.popleft()
        return sum(n for _, n in self.generated) / GEN_WINDOW_S
