"""What every command prints through: stdout lines, one-line errors on stderr, JSON."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

PROG = "sglang-supervisor"


def out(line: str = "") -> None:
    """A line on stdout, flushed (the CLI is followed live, often through a pipe)."""
    print(line, flush=True)


def err(line: str) -> None:
    """A one-line error on stderr, prefixed with the program's name."""
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def err_detail(line: str) -> None:
    """A continuation line of an error (indented by the caller), on stderr."""
    print(line, file=sys.stderr, flush=True)


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout (``--json``: nothing else goes there)."""
    out(json.dumps(data, indent=2))


def show(data: Any, render: Callable[[Any], str], *, as_json: bool) -> None:
    """``data`` as JSON (``--json``), else as ``render`` writes it for a person."""
    if as_json:
        print_json(data)
    else:
        out(render(data))
