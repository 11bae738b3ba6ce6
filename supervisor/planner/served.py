"""A running server's own sizing beats the formula: its ``max_total_num_tokens``, the
fraction it resolved and the weights it loaded, from ``/server_info`` and its launch log.

SGLang 0.5.23 logs, at start (paths under ``sglang/srt/``): ``server_args={...}`` with the
resolved ``mem_fraction_static`` (``entrypoints/engine.py:311``), ``Load weight end. ...
mem usage=X GB`` (GiB of weights on the rank, ``model_executor/model_runner.py:1372-1379``)
and ``KV Cache is allocated. #tokens: N`` (``mem_cache/memory_pool.py:2089-2097``). Where
the server's pool disagrees with the formula (a CUDA context, NCCL buffers, a loader that
keeps more than the checkpoint's bytes — one deployment of Kimi-K2.5 logged 116,171
tokens where the formula said ≈764K), the plan starts from what the server reports: the
bytes per rank the formula counts but the server does not have are charged to every
lever set the plan sizes (``ServedSizing.unseen_bytes_per_rank``), so the proposal is
scaled from the server's own figure, and a note says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sglang_supervisor.planner.model import GiB, ModelSpec

#: How much of a launch log is read for its start-up lines (they come first).
LOG_HEAD_BYTES = 8 << 20
#: Disagreements below this share of the formula's pool are not worth a note.
AGREES_WITHIN = 0.005

_FRACTION = re.compile(r"""['"]?mem_fraction_static['"]?\s*[:=]\s*([0-9]*\.?[0-9]+(?:e-?\d+)?)""")
_WEIGHTS = re.compile(r"Load weight end\..*?mem usage=([0-9]*\.?[0-9]+) GB")
_TOKENS = re.compile(r"KV Cache is allocated\. #tokens: (\d+)")


@dataclass(frozen=True)
class LaunchLog:
    """What a launch log says about the server's own sizing (None: not found)."""

    mem_fraction_static: float | None = None
    weight_bytes_per_rank: int | None = None
    kv_tokens: int | None = None


def read_launch_log(path: Path) -> LaunchLog:
    """The sizing lines of a server's launch log (blocking: call it off the event loop);
    nothing when the file cannot be read."""
    fraction: float | None = None
    weights: int | None = None
    tokens: int | None = None
    try:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            text = f.read(LOG_HEAD_BYTES)
    except OSError:
        return LaunchLog()
    for line in text.splitlines():
        if fraction is None and "server_args=" in line:
            m = _FRACTION.search(line)
            fraction = float(m.group(1)) if m else None
        elif weights is None and "Load weight end." in line:
            m = _WEIGHTS.search(line)
            weights = int(float(m.group(1)) * GiB) if m else None
        elif tokens is None and "KV Cache is allocated." in line:
            m = _TOKENS.search(line)
            tokens = int(m.group(1)) if m else None
    return LaunchLog(fraction, weights, tokens)


def lever_key(levers: Mapping[str, Any]) -> str:
    """A lever set as one comparable string (its values as JSON)."""
    return json.dumps(dict(levers), sort_keys=True, default=str)


@dataclass(frozen=True)
class ServedSizing:
    """A running server's own sizing for the lever set it serves."""

    #: The levers it serves (``lever_key``): its figures are that set's capacity.
    levers_key: str
    #: Its own ``max_total_num_tokens`` (one rank / DP worker).
    max_total_num_tokens: int
    #: The fraction it resolved (its launch log), None when not logged.
    mem_fraction_static: float | None
    #: The fraction its set is sized at here: the logged one, else the planner's.
    sized_fraction: float
    #: The weights its rank 0 loaded (its launch log), None when not logged.
    weight_bytes_per_rank: int | None
    #: What the planner's formula gives for the same set.
    formula_kv_tokens: int
    #: Bytes per rank the formula counts as KV budget that the server does not have
    #: (negative: it has more); charged to every lever set the plan sizes.
    unseen_bytes_per_rank: int
    #: Where the figures came from, in words.
    source: str

    def serves(self, levers: Mapping[str, Any]) -> bool:
        return lever_key(levers) == self.levers_key

    @property
    def disagreement(self) -> float:
        """The server's pool against the formula's, as a share of the formula's."""
        return self.max_total_num_tokens / max(1, self.formula_kv_tokens) - 1

    def to_json(self) -> dict[str, Any]:
        return {
            "max_total_num_tokens": self.max_total_num_tokens,
            "mem_fraction_static": self.mem_fraction_static,
            "weight_bytes_per_rank": self.weight_bytes_per_rank,
            "formula_kv_tokens_per_rank": self.formula_kv_tokens,
            "disagreement": round(self.disagreement, 4),
            "unseen_bytes_per_rank": self.unseen_bytes_per_rank,
            "source": self.source,
        }

    def note(self) -> str | None:
        """What the plan owes to the server's own figures (None when they agree)."""
        if abs(self.disagreement) < AGREES_WITHIN:
            return None
        loaded = (
            f"; its rank 0 loaded {self.weight_bytes_per_rank / GiB:.1f} GiB of weights"
            if self.weight_bytes_per_rank is not None
            else ""
        )
        fraction = (
            f" at mem_fraction_static {self.mem_fraction_static:g}"
            if self.mem_fraction_static is not None
            else ""
        )
        unseen = self.unseen_bytes_per_rank
        what = "counts but the server does not have" if unseen > 0 else "misses"
        return (
            f"The running server sized its own KV pool at {self.max_total_num_tokens:,} "
            f"tokens per rank{fraction} ({self.source}), where the formula gives "
            f"{self.formula_kv_tokens:,} ({self.disagreement:+.0%}){loaded}. The plan starts "
            f"from the server's figure: the {abs(unseen) / GiB:.1f} GiB per rank the formula "
            f"{what} is charged to every lever set it sizes, so the proposal's tokens are "
            "scaled from what the server really holds."
        )


def with_served(
    model: ModelSpec,
    levers: Mapping[str, Any],
    gpu_bytes: int,
    *,
    max_total_num_tokens: int,
    log: LaunchLog,
    source: str,
) -> ModelSpec:
    """``model`` with the running server's own sizing for ``levers`` (its served set).

    The formula's budget for ``levers`` (at the server's own fraction when it logged one)
    less the budget its pool shows is what every set the plan sizes is charged: half a
    token's cell short of the next token, so the formula gives exactly the server's pool
    for its own set. A Mamba hybrid's state pool is not re-derived: its figures are
    reported, not charged."""
    from sglang_supervisor.planner.pools import pools

    plain = replace(model, served=None)
    sized = dict(levers)
    if log.mem_fraction_static is not None and "mem_fraction_static" not in levers:
        sized["mem_fraction_static"] = log.mem_fraction_static
    p = pools(plain, sized, gpu_bytes)
    unseen = 0
    if not p.cells.mamba_state_bytes and p.cells.exact > 0:
        held = (max_total_num_tokens + 0.5) * p.cells.exact
        unseen = int(p.kv_budget_bytes - held)
    served = ServedSizing(
        levers_key=lever_key(levers),
        max_total_num_tokens=max_total_num_tokens,
        mem_fraction_static=log.mem_fraction_static,
        sized_fraction=p.mem_fraction_static,
        weight_bytes_per_rank=log.weight_bytes_per_rank,
        formula_kv_tokens=p.kv_tokens,
        unseen_bytes_per_rank=unseen,
        source=source,
    )
    return replace(model, served=served)
