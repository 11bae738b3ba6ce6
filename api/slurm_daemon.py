"""The daemon as the batch step of a Slurm allocation: one stop per signal from Slurm
(``SlurmTwins``), and the exit for a fresh allocation (``watch_allocation``).

Slurm signals the batch script and the daemon together (``scancel``, a time limit,
preemption, a node failure), and the script passes its signal on as SIGUSR1, for the
cases where Slurm signals the script alone (``scancel --batch``, ``--signal=B:``). So
SIGUSR1 is a graceful stop that never forces, and a SIGTERM within ``TWIN_S`` after the
SIGUSR1 that began the stop is its twin: neither forces the stop.

Under ``server.launcher = "slurm"``: once Slurm refuses this job's steps for good (its
``MaxStepCount`` reached, the job gone) or twice in a row (``/status``
``slurm.allocation_unusable``), no server can start in this allocation again, and a
daemon that stayed would hold its nodes forever. It stops as on a SIGTERM and exits
``EXIT_ALLOCATION_UNUSABLE`` (4), which the batch script turns into a fresh allocation
(``deploy/slurm/sglang-supervisor.sbatch`` requeues the job; docs/slurm.md).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable

from sglang_supervisor.engine import Supervisor

log = logging.getLogger("supervisor")

#: The daemon's exit status when its Slurm allocation can no longer host the server.
EXIT_ALLOCATION_UNUSABLE = 4
#: How often the launcher's status is looked at (a snapshot on the loop: cheap).
LOOK_S = 1.0
#: A SIGTERM this soon after the SIGUSR1 that began a stop is its twin (docstring).
TWIN_S = 2.0


class SlurmTwins:
    """Which of the daemon's stop signals only repeat one from Slurm (module docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._usr1_at = float("-inf")

    def absorbed(self, sig: signal.Signals, stopping: bool) -> bool:
        """Whether ``sig`` changes nothing: a SIGUSR1 once stopping, or the SIGTERM twin
        of the SIGUSR1 that began the stop. Call it for every SIGTERM/SIGINT/SIGUSR1."""
        now = self.clock()
        if sig == signal.SIGUSR1 and stopping:
            log.info("SIGUSR1 (the batch script's stop): already stopping")
            return True
        if sig == signal.SIGTERM and stopping and now - self._usr1_at < TWIN_S:
            self._usr1_at = float("-inf")
            log.info("SIGTERM (Slurm's, with the batch script's SIGUSR1): already stopping")
            return True
        if sig == signal.SIGUSR1:
            self._usr1_at = now
        return False


async def watch_allocation(sup: Supervisor, stop: Callable[[str], None]) -> None:
    """Call ``stop(reason)`` once the allocation is unusable, then return. Runs until
    cancelled otherwise (the daemon's exit)."""
    while True:
        await asyncio.sleep(LOOK_S)
        slurm = sup.view().slurm
        why = None if slurm is None else slurm.get("allocation_unusable")
        if why:
            log.error(
                "%s: this allocation can no longer host the server; stopping (exit status "
                "%d: the batch script asks Slurm for a fresh allocation)",
                why,
                EXIT_ALLOCATION_UNUSABLE,
            )
            stop(str(why))
            return
