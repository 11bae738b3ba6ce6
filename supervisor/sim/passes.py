"""The forward passes of the simulated server's schedulers (``Passes``): which pass runs
next on a DP worker, what admission takes into a prefill, what a pass does once it ends,
and the retraction of a decode batch the KV pool cannot hold. ``sim.load`` describes the
mechanics and cites SGLang; ``sim.scheduler`` holds each worker's state.

Each pass is decided at its start from the state then (``_decide``) and takes effect at
its end (``_apply``): a request arriving meanwhile waits for the next decision, as in
SGLang's event loop, and a token is visible only once the step that made it is over.
"""

from __future__ import annotations

from collections.abc import Callable

from sglang_supervisor.sim.scheduler import CLIP_MAX_NEW_TOKENS, Speeds, Step, _Worker
from sglang_supervisor.sim.workload import MAX_CATCH_UP_S, Request

#: Decode steps taken as one pass while requests wait (admission is looked at again after
#: each pass); without waiting requests a pass runs to the next finish or the present.
STEPS_WHILE_WAITING = 8


class Passes:
    """One engine's scheduling rules, applied to its workers (the engine's lock held)."""

    def __init__(
        self,
        max_total_num_tokens: int,
        max_running: int,
        speeds: Speeds,
        prefill_batch_tokens: int | None,
        prefill_limit_tokens: int | None,
        lookup: Callable[[_Worker, Request], int],
    ) -> None:
        self.max_total_num_tokens = max_total_num_tokens
        self.max_running = max_running
        self.speeds = speeds
        self.prefill_batch_tokens = prefill_batch_tokens
        self.prefill_limit_tokens = prefill_limit_tokens
        #: The prefix cache's lookup (``Engine._lookup``): cached tokens, key marked in use.
        self._lookup = lookup
        #: The prefill (tokens) that ran out of activation memory; None while none did.
        self.prefill_oom: int | None = None

    def advance(self, workers: list[_Worker], now: float) -> bool:
        """Every worker's forward passes that end by ``now``, each next one decided when
        the last ends (a stalled process replays at most ``MAX_CATCH_UP_S``); True when a
        real request got a token or ended."""
        woke = False
        for w in workers:
            if w.clock is None:
                w.clock = now
            for _ in range(100_000):  # bounded: every pass moves the clock forward
                step = w.step
                if step is not None:
                    if step.end > now:
                        break
                    woke |= self._apply(w, step)
                    w.step, w.clock = None, step.end
                w.clock = max(w.clock, now - MAX_CATCH_UP_S)
                if self.prefill_oom is not None:
                    break
                w.step = self._decide(w, w.clock, now)
                if w.step is None:
                    head = w.pending[0].arrived if w.pending else now
                    if w.clock < head <= now:
                        w.clock = head  # idle until the next arrival
                        continue
                    w.clock = max(w.clock, now)
                    break
        return woke

    def _decide(self, w: _Worker, t: float, now: float) -> Step | None:
        """The next forward pass from ``t``: a prefill when a request can be admitted
        (SGLang runs prefill first), else a decode of the running batch, else none."""
        prefill = self._admit(w, t)
        if prefill:
            return Step(t, t + self.speeds.prefill_s(sum(n for _, n in prefill)), prefill)
        if not w.running:
            w.last_decode_end = None
            return None
        if w.used + len(w.running) > self.max_total_num_tokens:
            self._retract(w)
            if not w.running:
                return None
        n = len(w.running)
        step_s = self.speeds.decode_s(n)
        room = max(1, (self.max_total_num_tokens - w.used) // n)
        if w.real_running:
            steps = 1  # a real client's tokens come step by step
        elif w.pending:
            steps = STEPS_WHILE_WAITING
        else:
            steps = max(1, int((now - t) / step_s) + 1)
        steps = min(steps, room, w.next_finish() or steps)
        return Step(t, t + steps * step_s, [], steps, n)

    def _admit(self, w: _Worker, t: float) -> list[tuple[Request, int]]:
        """``PrefillAdder`` over the waiting queue at ``t``: the chunked request's next
        chunk first, then new requests in order while they fit."""
        rem_total = self.max_total_num_tokens - w.used - w.reserved()
        rem_chunk = self.prefill_batch_tokens
        batch: list[tuple[Request, int]] = []
        chunked = w.chunked
        if chunked is not None:
            take = chunked.fill - chunked.in_kv
            take = take if rem_chunk is None else min(take, rem_chunk)
            batch.append((chunked, take))
            w.prefilling += take
            chunked.in_kv += take
            rem_total -= take
            rem_chunk = None if rem_chunk is None else rem_chunk - take
            if chunked.in_kv >= chunked.fill:
                w.chunked = None  # its last chunk: it decodes after this pass
        while w.pending and (rem_chunk is None or rem_chunk > 0) and w.chunked is None:
            req = w.pending[0]
            if req.arrived > t or len(w.running) + len(batch) >= self.max_running:
                break
            extend = req.fill - (req.prefix_tokens if w.hit(req) else 0)
            out_left = min(max(0, req.out_tokens - req.done_out), CLIP_MAX_NEW_TOKENS)
            alone = not w.running and not batch
            if extend + out_left + 1 >= rem_total and not alone:
                break
            take = extend if rem_chunk is None else min(extend, rem_chunk)
            prefill = sum(n for _, n in batch) + take
            if self.prefill_limit_tokens is not None and prefill > self.prefill_limit_tokens:
                self.prefill_oom = prefill
                break
            w.pending.popleft()
            self._admitted(w, req, take)
            batch.append((req, take))
            rem_total -= take + 1 + (out_left if take == extend else 0)
            if take < extend:
                w.chunked = req  # the rest of its prompt in the next passes
            rem_chunk = None if rem_chunk is None else rem_chunk - take
        return batch

    def _admitted(self, w: _Worker, req: Request, take: int) -> None:
        fresh = not req.admitted
        req.cached = self._lookup(w, req)
        req.keyed = True
        req.in_kv = req.cached + take
        w.prefilling += req.in_kv
        req.admitted = True
        w.real_running += 0 if req.synthetic else 1
        if fresh:
            w.prompt_total += req.prompt_tokens
        w.window.append((req.fill, req.cached))

    def _apply(self, w: _Worker, step: Step) -> bool:
        """The effects of a forward pass at its end; True when a real request got a token."""
        real = False
        for req, _ in step.prefill:
            if req.ended or req is w.chunked:
                continue  # aborted meanwhile, or more of its prompt to prefill
            w.prefilling -= req.in_kv
            req.in_kv = 0
            if not req.done_out:
                # Its first token comes out of the prefill (arrival to here, queue included).
                w.ttft_sum_s += max(0.0, step.end - req.arrived)
                w.ttft_count += 1
            real |= not req.synthetic
            generated = min(req.done_out + 1, req.out_tokens)
            if generated >= req.out_tokens:
                req.done_out = generated
                self.end(w, req, aborted=False)
            else:
                w.start_decoding(req, generated)
        if step.decode_steps:
            n, k = step.batch, step.decode_steps
            stall = 0.0 if w.last_decode_end is None else step.start - w.last_decode_end
            w.itl_sum_s += n * (stall + step.end - step.start)
            w.itl_count += n * k
            w.last_decode_end = step.end
            w.steps += k
            w.generated.append((step.end, n * k))
            w.decay_ratio(k)
            real |= w.real_running > 0
            for req in w.finished_now():
                self.end(w, req, aborted=False)
        return real

    def _retract(self, w: _Worker) -> None:
        """The pool cannot hold the next token of every running request: retract the
        newest until it can (keeping one); one alone that cannot fit is aborted."""
        while len(w.running) > 1 and w.used + len(w.running) > self.max_total_num_tokens:
            req = w.newest()
            w.stop_decoding(req)
            self._release_key(w, req)
            w.real_running -= 0 if req.synthetic else 1
            w.retracted_total += 1
            req.keyed = False
            w.pending.append(req)  # FCFS: SGLang appends it to the waiting queue
        if w.used + len(w.running) > self.max_total_num_tokens:
            self.end(w, w.newest(), aborted=True)
        w.ratio_after_retract()

    def end(self, w: _Worker, req: Request, *, aborted: bool) -> None:
        """``req`` leaves the engine: its KV freed, counted as SGLang's tokenizer counts
        a finished (or aborted) request."""
        if req.ended:
            return
        if req.s0 is not None:
            w.stop_decoding(req)
        elif req.in_kv or w.chunked is req:
            w.prefilling -= req.in_kv
            if w.chunked is req:
                w.chunked = None
        elif req in w.pending:
            w.pending.remove(req)
        if req.keyed:
            self._release_key(w, req)
            w.real_running -= 0 if req.synthetic else 1
        # What it computed beyond the shared prefix stays in the radix tree, evictable:
        # never reused, it only takes room (SGLang caches every finished request's KV).
        rest = req.prompt_tokens + req.done_out - req.prefix_tokens
        if rest > 0 and not aborted:
            w.cache.insert(f"u:{req.seq}", rest, self.max_total_num_tokens - w.used)
        req.in_kv, req.ended = 0, True
        w.gen_total += req.done_out
        w.requests_total += 1
        w.aborted_total += aborted

    @staticmethod
    def _release_key(w: _Worker, req: Request) -> None:
        req.keyed = False
        w.running_keys[req.key] -= 1
        if w.running_keys[req.key] <= 0:
            del w.running_keys[req.key]
