"""One signal from Slurm is one graceful stop (api/slurm_daemon.py ``SlurmTwins``): Slurm
signals the batch script and the daemon together (``scancel``, a time limit, preemption,
a node failure) and the script passes its own on as SIGUSR1, so the pair, in either
order, stops the daemon once without forcing; a SIGUSR1 alone (``scancel --batch``, the
``--signal=B:`` warning) stops it gracefully; a real second SIGTERM still forces. The same
on the real cluster through the shipped sbatch: tests/slurm/test_batch.py."""

from __future__ import annotations

import signal
from pathlib import Path

from sglang_supervisor_api.slurm_daemon import TWIN_S, SlurmTwins
from tests.unit.fakes import run
from tests.unit.test_daemon_stopping import stopping_for


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_slurms_sigterm_and_the_scripts_sigusr1_are_one_graceful_stop(tmp_path: Path) -> None:
    async def main() -> None:
        for first, second in ((signal.SIGUSR1, signal.SIGTERM), (signal.SIGTERM, signal.SIGUSR1)):
            stopping, sup, server = stopping_for(tmp_path / first.name)
            stopping.twins = SlurmTwins(clock := Clock())
            stopping.on_signal(first)
            clock.now += 0.01
            stopping.on_signal(second)
            assert sup.shutdown_requested and server.should_exit
            assert not sup.shutdown_forced and not server.force_exit, (first, second)
            # An operator's SIGTERM after that still forces (no drain, no grace).
            clock.now += 0.5
            stopping.on_signal(signal.SIGTERM)
            assert sup.shutdown_forced and server.force_exit

    run(main)


def test_the_scripts_sigusr1_alone_stops_gracefully(tmp_path: Path) -> None:
    async def main() -> None:
        stopping, sup, server = stopping_for(tmp_path)
        stopping.on_signal(signal.SIGUSR1)
        assert sup.shutdown_requested and not sup.shutdown_forced and server.should_exit
        stopping.on_signal(signal.SIGUSR1)  # the script never forces
        assert not sup.shutdown_forced

    run(main)


def test_a_sigterm_long_after_the_sigusr1_is_a_second_stop_request(tmp_path: Path) -> None:
    async def main() -> None:
        stopping, sup, server = stopping_for(tmp_path)
        stopping.twins = SlurmTwins(clock := Clock())
        stopping.on_signal(signal.SIGUSR1)
        clock.now += TWIN_S + 1
        stopping.on_signal(signal.SIGTERM)
        assert sup.shutdown_forced and server.force_exit

    run(main)
