"""``sglang-supervisor cleanup``: stop every process carrying this instance's launch tag.

Meant for systemd's ``ExecStopPost=`` in the ``KillMode=process`` drop-in, where a
stopping daemon leaves the server running for the next daemon to adopt. ``ExecStopPost``
runs on ``systemctl stop``, on ``systemctl restart`` and after a crash alike; with
``--only-if-stopped`` the cleanup happens only on a real stop: not when the service failed
(``$SERVICE_RESULT`` other than ``success``: the restarted daemon adopts the server) and
not when a start or restart job for the unit is queued.

It refuses while a daemon runs on the state directory (its lock is held): that server is
the daemon's to stop (``systemctl stop``, or ``POST /stop``), never ours to kill under it.
``--state-dir`` is ``serve``'s: with no ``instance`` configured, the instance (and so the
launch tag) is derived from the state directory.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from sglang_supervisor_api.instance_lock import owner_pid as instance_owner
from sglang_supervisor_api.state_lock import daemon_holding

DESCRIPTION = (
    "Stop every process carrying this instance's launch tag (the SGLang server a daemon "
    "left running) and verify nothing of it is left. Meant for systemd's ExecStopPost= in "
    "the keep-server drop-in; with --only-if-stopped it does nothing while systemd restarts "
    "the service or after a failure (the next daemon adopts the server). Exit 0 nothing of "
    "the instance is left (or skipped), 1 something is, 2 refused: a bad configuration, or "
    "the daemon still runs on the state dir (stop it instead)."
)


def add_cleanup_parser(sub: Any) -> None:
    p = sub.add_parser(
        "cleanup",
        help="stop every process of this instance (ExecStopPost)",
        description=DESCRIPTION,
    )
    p.add_argument("--config", type=Path, help="the daemon's TOML config (instance, timeouts)")
    p.add_argument(
        "--state-dir", type=Path, help="the daemon's state dir (as given to serve --state-dir)"
    )
    p.add_argument(
        "--only-if-stopped",
        action="store_true",
        help="do nothing when systemd is restarting the service or it failed",
    )
    p.add_argument("--unit", default="sglang-supervisor.service", help="the systemd unit")


def restart_pending(unit: str) -> str | None:
    """Why the server should be kept (a restart is coming), or None for a real stop."""
    result = os.environ.get("SERVICE_RESULT")
    if result is not None and result != "success":
        return f"the service ended with {result}: the restarted daemon will adopt the server"
    systemctl = shutil.which("systemctl")
    if systemctl is None:
        return None
    try:
        out = subprocess.run(
            [systemctl, "list-jobs", "--no-legend", "--plain"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[1] == unit and fields[2] in ("start", "restart"):
            return f"a {fields[2]} job for {unit} is queued: the next daemon adopts the server"
    return None


def run_cleanup(args: argparse.Namespace) -> int:
    """0 when nothing of the instance is left (or the cleanup was skipped), else 1."""
    from sglang_supervisor.config import instance_name, load_settings

    overrides = {"state_dir": str(args.state_dir) if args.state_dir else None}
    try:
        settings = load_settings(args.config, overrides)
    except ValueError as exc:
        print(f"sglang-supervisor cleanup: {exc}", file=sys.stderr)
        return 2
    pid = daemon_holding(settings.state_dir)
    if pid is not None:
        print(
            f"sglang-supervisor cleanup: refused: the daemon (pid {pid}) still runs on state "
            f"dir {settings.state_dir} and owns the server; stop the daemon instead "
            "(systemctl stop sglang-supervisor, or sglang-supervisor stop for the server alone)",
            file=sys.stderr,
        )
        return 2
    owner = instance_owner(instance_name(settings))
    if owner is not None:
        print(
            f"sglang-supervisor cleanup: refused: instance {instance_name(settings)!r} is "
            f"owned by a live daemon (pid {owner}, perhaps on another state dir) that owns "
            "its server; stop that daemon instead",
            file=sys.stderr,
        )
        return 2
    if args.only_if_stopped:
        why = restart_pending(args.unit)
        if why is not None:
            print(f"cleanup skipped: {why}")
            return 0
    from sglang_supervisor.runtime import cleanup  # the process machinery, only when needed

    report = cleanup(settings)
    print(f"cleanup of instance {instance_name(settings)!r}: {report.describe()}")
    return 0 if report.clean else 1
