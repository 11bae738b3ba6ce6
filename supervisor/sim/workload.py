"""The simulated server's synthetic workload: ``SGLANG_SIM_LOAD``, parsed (see
``sglang_supervisor.sim.load`` for what the engine does with it)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from sglang_supervisor.sim import envlist

LOAD_ENV = "SGLANG_SIM_LOAD"
#: Simulated speeds (``SGLANG_SIM_TOKENS_PER_S``, ``SGLANG_SIM_PREFILL_TOKENS_PER_S``):
#: decode tokens/s of one request in a small batch, and prompt tokens/s of a prefill
#: pass. The prefill default is faster than a 70B model on 8 H200s (~20,000 tokens/s), so
#: that a KV-bound load fills the pool in seconds, not minutes.
DECODE_TOKENS_PER_S = 100.0
PREFILL_TOKENS_PER_S = 2_000_000.0
MAX_RATE = 2000.0
#: Admissions the cache hit rate is averaged over (SGLang's gauge is recent, not lifetime).
HIT_RATE_WINDOW = 256
#: A stalled process does not replay the arrivals it missed beyond this many seconds.
MAX_CATCH_UP_S = 2.0


@dataclass(frozen=True)
class LoadSpec:
    """A synthetic workload (``SGLANG_SIM_LOAD``; see ``sglang_supervisor.sim.load``)."""

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
    for item, key, has_value, value in envlist.items(text):
        if not has_value or key not in _LIMITS:
            raise ValueError(
                f"{LOAD_ENV}: {item!r} is not one of {', '.join(k + '=' for k in _LIMITS)}"
            )
        kind, low, high = _LIMITS[key]
        number = envlist.number(value)
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


@dataclass(eq=False)
class Request:
    """One request: a real ``/generate`` or a synthetic one, and where it runs."""

    need: int
    prompt_tokens: int
    out_tokens: int
    #: Prefix-cache key and the prompt tokens it covers.
    key: str
    prefix_tokens: int
    synthetic: bool
    worker: int = 0
    #: Taken into a prefill batch at least once.
    admitted: bool = False
    cached: int = 0
    #: When it arrived (the engine's clock): its time to first token counts from here.
    arrived: float = 0.0
    #: Its place in arrival order (the decode batch keeps it).
    seq: int = 0
    #: While decoding: the worker's decode step count when it had no token yet.
    s0: int | None = None
    #: Tokens generated before it left the decode batch (a retraction; or at its end).
    done_out: int = 0
    #: Prompt tokens in the KV pool while it is being prefilled (a chunk at a time).
    in_kv: int = 0
    #: Its prefix key counts as in use (it sits in a batch: prefilling or decoding).
    keyed: bool = False
    #: It has ended (finished, aborted): its KV is free.
    ended: bool = False

    @property
    def fill(self) -> int:
        """Tokens a prefill must put in the KV pool: the prompt, and after a retraction
        the output so far (SGLang prefills ``origin_input_ids + output_ids`` again)."""
        return self.prompt_tokens + self.done_out


def synthetic(load: LoadSpec, rng: random.Random, prefix_cum: list[float]) -> Request:
    """The next synthetic request: ~``avg_tokens`` (uniform in [T/2, 3T/2]), its shared
    prefix drawn Zipf-popular (``prefix_cum``: the cumulative weights)."""
    need = max(2, int(load.avg_tokens * rng.uniform(0.5, 1.5)))
    out = max(1, min(load.out_tokens, need // 2))
    prompt = need - out
    prefix = rng.choices(range(load.prefixes), cum_weights=prefix_cum)[0]
    return Request(
        need=need,
        prompt_tokens=prompt,
        out_tokens=out,
        key=f"s:{prefix}",
        prefix_tokens=min(prompt, int(load.prefix_share * load.avg_tokens)),
        synthetic=True,
    )
