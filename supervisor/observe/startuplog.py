"""What a launch's log says about its start: SGLang's decode CUDA-graph capture, timed.

SGLang 0.5.23 logs, once the decode graphs are captured
(``model_executor/model_runner_components/cuda_graph_setup.py:786-791``)::

    Capture target decode CUDA graph end. bs=[1, 2, 4, 8, ...], elapsed=12.34 s, mem usage=...

so the seconds one graph takes on this model and GPU are ``elapsed / len(bs)``: the cost a
larger ``cuda_graph_max_bs_decode`` adds to every start. The line comes early in a
launch's log: only its head is read (blocking: call it from a worker thread).
"""

from __future__ import annotations

import re
from pathlib import Path

#: How much of a launch's log is read: start-up fits well within it.
HEAD_BYTES = 4 * 1024 * 1024

_CAPTURE = re.compile(
    r"Capture target decode \S+ graph end\. bs=\[(?P<bs>[\d,\s]*)\], elapsed=(?P<s>[\d.]+) s"
)


def graph_seconds_each(text: str) -> float | None:
    """Seconds per captured decode graph from the first capture line in ``text``."""
    m = _CAPTURE.search(text)
    if m is None:
        return None
    sizes = [x for x in m["bs"].split(",") if x.strip()]
    if not sizes:
        return None
    return float(m["s"]) / len(sizes)


def launch_graph_seconds(log_path: Path) -> float | None:
    """``graph_seconds_each`` of a launch's log (None: no such line, or no log)."""
    try:
        with open(log_path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError:
        return None
    return graph_seconds_each(head.decode(errors="replace"))
