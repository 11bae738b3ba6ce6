"""The comma lists ``name[=value],...`` the simulated server reads from its environment
(``SGLANG_SIM_FAULTS``, ``SGLANG_SIM_LOAD``)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple


class Item(NamedTuple):
    #: The item as written (stripped), for error messages.
    text: str
    name: str
    #: True when the item has an ``=``.
    has_value: bool
    value: str


def items(text: str) -> Iterator[Item]:
    """The non-empty items of a comma list, each split at its first ``=``."""
    for raw in text.split(","):
        item = raw.strip()
        if item:
            name, sep, value = item.partition("=")
            yield Item(item, name.strip(), bool(sep), value)


def number(value: str) -> float:
    """``value`` as a float; NaN when it is not a number (every range check refuses NaN)."""
    try:
        return float(value)
    except ValueError:
        return math.nan
