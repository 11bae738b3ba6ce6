"""The ``sglang-supervisor`` console script.

Before anything of ours is imported, it refuses an environment that also has Supervisord
(PyPI's ``supervisor``): that package's import name is ``supervisor`` too, and pip lays
both into one ``site-packages/supervisor/`` directory, each overwriting the other's
modules (both have ``states.py`` and ``process.py``) - silently, until something breaks.
Only the standard library is used here, so the message comes even when our modules are
already overwritten.
"""

from __future__ import annotations

import sys

EXIT_CONFIG = 2


def supervisord_conflict() -> str | None:
    """Why this environment cannot run sglang-supervisor, or None."""
    from importlib import metadata  # after the daemon's signal handlers (main)

    try:
        dist = metadata.distribution("supervisor")
    except metadata.PackageNotFoundError:
        return None
    where = dist.locate_file("")
    return (
        f"Supervisord (the PyPI package 'supervisor' {dist.version}, in {where}) is installed "
        f"in the same Python environment ({sys.prefix}). Its import package is also named "
        "'supervisor' and the two overwrite each other's modules. Install sglang-supervisor "
        "in a dedicated environment, e.g. python3 -m venv /opt/sglang-supervisor && "
        "/opt/sglang-supervisor/bin/pip install sglang-supervisor (Supervisord itself may "
        "stay where it is)."
    )


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv)[:1] == ["serve"]:
        # The daemon's signal handlers first, before anything else is imported or looked
        # up (importlib.metadata scans sys.path): a SIGHUP (or SIGTERM) in the daemon's
        # first instant is recorded, not the default action that kills it.
        from api.daemon_signals import process_signals

        process_signals().install()
    problem = supervisord_conflict()
    if problem is not None:
        print(f"sglang-supervisor: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    from api.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
