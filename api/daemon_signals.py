"""The daemon's signals: recorded from the first instant, handled on the event loop.

gunicorn's arbiter is the model: a handler only records the signal, and the loop
dispatches it. ``install()`` runs before the daemon's heavy imports, so a SIGTERM while
Python is still importing, or while the supervisor starts, is never lost (Python's
default action would kill the daemon on the spot and leave its server unsupervised);
``attach()`` hands the recorded signals, and every later one, to the loop through
``loop.add_signal_handler`` (which wakes the loop even while it waits on a worker
thread). Standard library only: it is imported before anything else of the daemon.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

#: SIGTERM/SIGINT stop the daemon (a second one forces); SIGHUP reloads its settings;
#: SIGUSR1 is a stop that never forces: the Slurm batch script's, beside the SIGTERM Slurm
#: itself sends the daemon (deploy/slurm/sglang-supervisor.sbatch; docs/slurm.md).
HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)

Dispatch = Callable[[signal.Signals], None]


class DaemonSignals:
    """The daemon's handlers for ``HANDLED``: record until attached to a loop, then
    dispatch there, in the order the signals came."""

    def __init__(self) -> None:
        #: Signals received while no loop was attached, oldest first.
        self.pending: list[signal.Signals] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dispatch: Dispatch | None = None

    def install(self) -> None:
        """Record every handled signal from now on (main thread only)."""
        for sig in HANDLED:
            signal.signal(sig, self._record)

    def _record(self, signum: int, _frame: FrameType | None) -> None:
        self.pending.append(signal.Signals(signum))

    def attach(self, loop: asyncio.AbstractEventLoop, dispatch: Dispatch) -> None:
        """From now on ``dispatch(sig)`` runs on ``loop`` for every signal; the ones
        recorded before are dispatched first (soon, on the loop)."""
        self._loop, self._dispatch = loop, dispatch
        for sig in HANDLED:
            loop.add_signal_handler(sig, dispatch, sig)
        # Taken after the handlers moved to the loop: nothing falls in between.
        early, self.pending = self.pending, []
        for sig in early:
            loop.call_soon(dispatch, sig)

    def detach(self) -> None:
        """Back to recording (the loop is about to close; the daemon is exiting)."""
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            for sig in HANDLED:
                loop.remove_signal_handler(sig)
        self.install()

    def ignore_from_now(self) -> None:
        """The daemon has stopped and is exiting: a late SIGTERM, SIGINT or SIGHUP changes
        nothing, so ignore them. Not "record": CPython's finalization puts every
        Python-level handler back to the default action (``_PySignal_Fini``), and a
        SIGTERM in the last ~0.15 s of the process then killed it with -15 after a clean
        stop; an ignored signal stays ignored through finalization."""
        for sig in HANDLED:
            signal.signal(sig, signal.SIG_IGN)


_process_signals: DaemonSignals | None = None


def process_signals() -> DaemonSignals:
    """The process's one ``DaemonSignals`` (signal handlers are process-wide)."""
    global _process_signals
    if _process_signals is None:
        _process_signals = DaemonSignals()
    return _process_signals
