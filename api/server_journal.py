"""``[server] log_to_journal``: the daemon forwards its server's log into its own log.

The forwarding itself (bounded, in a worker thread, redacted) is
``sglang_supervisor.observe.logforward``; this module tells it which file to follow — the
launch log of the server the supervisor has now — and which values are secret there.
"""

from __future__ import annotations

from sglang_supervisor.config import Settings
from sglang_supervisor.engine import Supervisor
from sglang_supervisor.observe.logforward import LogForwarder, Source
from sglang_supervisor.redact import secret_values


def server_log_forwarder(settings: Settings, sup: Supervisor) -> LogForwarder | None:
    """A started forwarder when ``[server] log_to_journal`` is on; None otherwise."""
    if not settings.server.log_to_journal:
        return None

    def source() -> Source | None:
        server = sup.view().server
        if server is None:
            return None
        return Source(
            server.log_path,
            server.pid,
            secret_values(dict(server.levers.levers), dict(server.levers.env)),
        )

    # The launch logs already there (an adopted server's among them), listed before
    # start-up can launch anything: a bounded directory (log_keep_launches), read once.
    logs = sup.view().logs_dir
    earlier = frozenset(logs.glob("*.log")) if logs.is_dir() else frozenset()
    forwarder = LogForwarder(source, earlier=earlier)
    forwarder.start()
    return forwarder
