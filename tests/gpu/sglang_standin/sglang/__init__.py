"""An SGLang-shaped stand-in for the real-mode end-to-end test (``tests/gpu``).

Put this directory's parent on ``sys.path`` *before* a real SGLang installation (the
test writes both into a ``.pth`` file of a throwaway virtual environment). Then

* ``python -m sglang.launch_server ...`` runs the stand-in in this directory: torch ranks
  holding GPU memory and SGLang's HTTP endpoints, no model;
* every other module (``sglang.srt.server_args``, ``sglang.version``...) is SGLang's own,
  from the real installation: this package's search path continues there, so the
  supervisor's schema probe and validation run SGLang's real parser and checks;
* ``importlib.metadata.version("sglang")`` answers from the real ``.dist-info``.

Without a real SGLang further down ``sys.path`` only ``launch_server`` exists, and the
daemon reports (correctly) that its interpreter cannot run SGLang.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _real_sglang_dirs() -> list[str]:
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != _ROOT]
    spec = PathFinder.find_spec("sglang", others)
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [d for d in spec.submodule_search_locations if os.path.abspath(d) != _ROOT]


__path__.extend(_real_sglang_dirs())  # a package's own search path

try:
    from importlib.metadata import version as _version

    __version__ = _version("sglang")
except Exception:  # no real SGLang: only the stand-in's launcher exists
    __version__ = "0+standin"
