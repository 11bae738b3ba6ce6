"""The simulated scheduler follows SGLang 0.5.23's mechanics, on a fake clock: admission by
the free KV tokens after the running requests' outputs to come (``new_token_ratio``,
``srt/managers/schedule_policy.py`` ``PrefillAdder``), the chunked-prefill budget, a
decode step for the whole batch, and retraction when the pool cannot hold the next token
(``srt/managers/schedule_batch.py`` ``retract_decode``)."""

from __future__ import annotations

import pytest

from sglang_supervisor.sim.load import Engine, LoadSpec
from sglang_supervisor.sim.scheduler import PREFILL_STEP_S, Speeds


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def advance(engine: Engine, clock: Clock, seconds: float, step: float = 0.01) -> None:
    end = clock.now + seconds
    while clock.now < end:
        clock.now += step
        engine.tick()


def test_admission_keeps_back_the_running_requests_outputs_to_come() -> None:
    # A pool of 10,000 tokens; requests of 1,000 prompt tokens and 4,000 to generate.
    # The first runs alone; the second fits (1,000 + 4,000 + 1 < 10,000 - 1,001 - 0.7 x
    # 3,999); the third does not (10,000 - 2,002 - 0.7 x 7,998 = 2,400 left): it waits.
    for conservativeness, admitted in ((1.0, 2), (0.5, 3)):
        clock = Clock()
        e = Engine(10_000, 64, clock=clock, schedule_conservativeness=conservativeness)
        reqs = [e.submit(f"r{i}", 1000, 4000) for i in range(4)]
        advance(e, clock, 0.05)
        assert sum(r is not None and r.admitted for r in reqs) == admitted, conservativeness
        assert e.stats().queued == 4 - admitted


def test_a_long_prompt_is_prefilled_a_chunk_at_a_time() -> None:
    ttft = {}
    for chunk in (None, 8192, 2048):
        clock = Clock()
        e = Engine(100_000, 8, clock=clock, prefill_batch_tokens=chunk)
        req = e.submit("long", 30_000, 4)
        assert req is not None
        advance(e, clock, 2.0, step=0.001)
        s = e.stats()
        assert req.ended and s.ttft_count == 1
        ttft[chunk] = s.ttft_sum_s
    passes = {None: 1, 8192: 4, 2048: 15}
    for chunk, n in passes.items():
        # n passes of the fixed cost, the 30,000 tokens once (the clock ticks in ms).
        expected = n * PREFILL_STEP_S + 30_000 / Speeds(0.01).prefill_tokens_per_s
        assert ttft[chunk] == pytest.approx(expected, abs=0.002), chunk


def test_decode_steps_make_one_token_per_request_and_throughput_follows_the_batch() -> None:
    load = LoadSpec(rate=200, avg_tokens=2000, out_tokens=1000, seed=1)
    through = {}
    for running in (4, 32):
        clock = Clock()
        e = Engine(1_000_000, running, load=load, clock=clock, decode_graph_max_bs=64)
        advance(e, clock, 5.0, step=0.1)
        s = e.stats()
        assert s.running == running and s.queued > 100
        through[running] = s.gen_throughput
    # A step is 10 ms whatever the batch (memory-bound decode of small batches): eight
    # times the batch, eight times the tokens (less the prefill passes between steps).
    assert 6.5 < through[32] / through[4] <= 8.0
    assert through[4] == pytest.approx(4 * 100, rel=0.05)
    # Past the captured CUDA graphs a step runs eagerly: slower.
    sp = Speeds(0.01, graph_max_bs=64)
    assert (sp.decode_s(64), sp.decode_s(65)) == (0.01, pytest.approx(0.0125))


def test_a_pool_that_cannot_hold_the_next_token_retracts_the_newest() -> None:
    # Ten requests of 500 prompt + 500 output tokens in a pool of 6,000: admission lets
    # in more than their whole outputs need once the ratio has decayed; decoding fills
    # the pool, the newest are retracted and prefilled again later. Nothing is lost.
    clock = Clock()
    e = Engine(6_000, 64, clock=clock, schedule_conservativeness=0.2)
    reqs = [e.submit(f"r{i}", 500, 500) for i in range(10)]
    advance(e, clock, 60.0, step=0.05)
    s = e.stats()
    assert s.retracted_total > 0
    assert all(r is not None and r.ended for r in reqs)
    assert s.generation_tokens_total == 10 * 500
    assert s.requests_total == 10 and s.aborted_total == 0
    assert s.tokens == 0 and s.running == 0


def test_a_real_request_gets_its_tokens_as_the_steps_make_them() -> None:
    e = Engine(100_000, 8, tokens_per_s=200)
    r = e.generate("hello", 10, 20)
    assert r is not None and r.completion_tokens == 20
    # The prefill's token, then 19 decode steps of 5 ms (eager: 6.25 ms) at least.
    assert r.latency_s >= 19 * 0.005
    s = e.stats()
    assert s.itl_count == 19 and s.itl_sum_s >= 19 * 0.005
    assert s.requests_total == 1 and s.generation_tokens_total == 20
