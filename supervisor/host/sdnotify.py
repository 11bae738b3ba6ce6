"""systemd's notify protocol (sd_notify), without a dependency: one datagram per message.

Under ``Type=notify`` systemd sets ``NOTIFY_SOCKET``; outside systemd every call is a
no-op that returns False. ``WATCHDOG_USEC`` asks for ``WATCHDOG=1`` pings.
"""

from __future__ import annotations

import os
import socket


def notify(message: str) -> bool:
    """Send ``message`` (e.g. ``READY=1``, ``STATUS=...``) to systemd; False if not under it."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(address)
            s.sendall(message.encode())
    except OSError:
        return False
    return True


def watchdog_interval_s() -> float | None:
    """Half the watchdog timeout systemd asked for (the usual ping interval), or None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(0.5, int(usec) / 2e6)
    except ValueError:
        return None
