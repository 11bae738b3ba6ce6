"""Reading a lever set: numbers, booleans, SGLang's human-readable counts."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sglang_supervisor.sglang.layout import Layout


def parse_count(text: object) -> int | None:
    """SGLang's human-readable integers: ``4096``, ``128k`` (×1000), ``1Mi`` (×2^20)."""
    if text is None or isinstance(text, bool):
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kMGT]i?)?\s*", str(text))
    if m is None:
        return None
    number, suffix = float(m.group(1)), m.group(2) or ""
    powers = {"k": 1, "M": 2, "G": 3, "T": 4}
    if suffix.endswith("i"):
        return int(number * 1024 ** powers[suffix[0]])
    return int(number * 1000 ** powers[suffix] if suffix else number)


def lever_int(levers: Mapping[str, Any], name: str) -> int | None:
    value = levers.get(name)
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def lever_float(levers: Mapping[str, Any], name: str) -> float | None:
    value = levers.get(name)
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def lever_bool(levers: Mapping[str, Any], name: str) -> bool:
    value = levers.get(name)
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def parallel_sizes(levers: Mapping[str, Any]) -> tuple[int, int, int]:
    """(tp, pp, dp replicas), each at least 1, as ``sglang_supervisor.sglang.layout`` resolves
    them."""
    shape = Layout.of(levers)
    return shape.tp_size, shape.pp_size, shape.dp_size


def speculative(levers: Mapping[str, Any]) -> bool:
    """Whether speculative decoding is on (``speculative_algorithm`` set)."""
    algo = levers.get("speculative_algorithm")
    return isinstance(algo, str) and algo.strip().upper() not in ("", "NONE")


def deepep(levers: Mapping[str, Any]) -> bool:
    return str(levers.get("moe_a2a_backend") or "").lower() == "deepep"


#: SGLang 0.5.23 sets max_running_requests to 48 for speculative decoding when unset
#: (``arg_groups/speculative_hook.py:442``).
SPECULATIVE_DEFAULT_MAX_RUNNING = 48


def requested_max_running(levers: Mapping[str, Any]) -> int | None:
    """``max_running_requests`` as SGLang resolves it before sizing: the lever, else 48
    with speculative decoding, else None (derived from the pool)."""
    value = lever_int(levers, "max_running_requests")
    if value is not None and value > 0:
        return value
    return SPECULATIVE_DEFAULT_MAX_RUNNING if speculative(levers) else None
