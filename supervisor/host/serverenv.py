"""The environment the SGLang server inherits from the daemon.

Left out: the daemon's own settings (``SGLANG_SUPERVISOR_*``) and systemd's handles that
belong to the unit's main process only — ``NOTIFY_SOCKET`` (a server that notifies would
speak for the daemon: READY, STOPPING, or a MAINPID change), ``WATCHDOG_USEC`` /
``WATCHDOG_PID`` (the daemon's watchdog) and ``LISTEN_FDS`` / ``LISTEN_PID`` /
``LISTEN_FDNAMES`` (socket activation). Added: ``PROMETHEUS_MULTIPROC_DIR`` under the
state directory unless the operator set one. SGLang keeps its metrics files there (a
fresh subdirectory per launch, removed at its exit); left to SGLang it would be a
directory in ``/tmp``, which is the unit's private ``/tmp`` under systemd and is deleted
when the daemon stops: with the keep-server drop-in, the adopted server's ``/metrics``
would then answer empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

#: Variables systemd sets for the unit's main process only.
SYSTEMD_MAIN_PROCESS_VARS = frozenset(
    {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"}
)
MULTIPROC_VAR = "PROMETHEUS_MULTIPROC_DIR"


def multiproc_dir(state_dir: Path) -> Path:
    return state_dir / "prometheus"


def server_environ(environ: Mapping[str, str], state_dir: Path) -> dict[str, str]:
    """``environ`` as the server should inherit it (see the module's docstring).

    Creates ``<state_dir>/prometheus`` (SGLang requires the directory to exist).
    """
    env = {
        k: v
        for k, v in environ.items()
        if not k.startswith("SGLANG_SUPERVISOR_") and k not in SYSTEMD_MAIN_PROCESS_VARS
    }
    if MULTIPROC_VAR not in env:
        path = multiproc_dir(state_dir)
        path.mkdir(parents=True, exist_ok=True)
        env[MULTIPROC_VAR] = str(path)
    return env
