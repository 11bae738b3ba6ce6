"""The ``sglang-supervisor`` command line: ``serve`` runs the daemon
(``sglang_supervisor_api.daemon``), the other commands talk to a running one through
``sglang_supervisor_api.cli.client``, its one HTTP client.

Where things are:

- ``main``: the parser of every command and the dispatch (the console script's ``main``);
- ``options``: the options every client command shares (``--url``, ``--token``...);
- ``runner``: runs a client command and turns every failure into one line and an exit code
  (``exits``);
- ``client`` / ``event_stream``: the daemon's HTTP API and its ``/events`` stream;
- ``inspect_commands``: status, levers, schema, logs, events;
- ``operation_commands``: apply, stop, start, restart, followed live by ``follow``
  (phases, GPU memory) and ``server_log`` (the new server's log while it starts);
- ``plan`` / ``plan_render``: the KV-capacity planner's command;
- ``serve``, ``cleanup``: the daemon, and its ExecStopPost cleanup;
- ``text``, ``render``, ``render_live``, ``output``: what the commands print.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """The console script ``sglang-supervisor`` (imports the command line only when run).

    For ``serve`` the daemon's signal handlers go in first, before any import of ours:
    a SIGTERM while the daemon is still importing is then recorded and honoured, instead
    of killing it on the spot (``sglang_supervisor_api.daemon_signals``).
    """
    if (sys.argv[1:] if argv is None else argv)[:1] == ["serve"]:
        from sglang_supervisor_api.daemon_signals import process_signals

        process_signals().install()
    from sglang_supervisor_api.cli.main import main as run

    return run(argv)
