"""The installed package's version, for ``--version``, ``/status``, ``/healthz`` and the
``build_info`` metric."""

from __future__ import annotations

import platform
from functools import cache
from importlib import metadata

DISTRIBUTION = "sglang-supervisor"


@cache
def version() -> str:
    """The version pip installed (``0+unknown`` when run from an uninstalled checkout)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"


def python_version() -> str:
    return platform.python_version()
