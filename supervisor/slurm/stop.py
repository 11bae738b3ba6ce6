"""The server step's stop, leader first, and every node's sweep after it.

SGLang's nodes >= 1 ignore SIGTERM; its rank 0 drains and broadcasts the shutdown to the
other nodes. So: SIGTERM to node 0's task alone (through the per-node presence; a
``scancel -s TERM`` would signal every process of every task, cutting requests in
flight), up to ``grace_s`` for the step to end; then ``scancel -s KILL <job>.<step>``
(Slurm kills every process of the step on every node) and up to ``kill_timeout_s``; then
the sweep of our tagged processes on every node at once (Slurm's ``proctrack/linuxproc``
loses a process that re-parents), which SIGKILLs what is left and names what survived.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sglang_supervisor.host import process
from sglang_supervisor.host.gpu import GpuQueryError
from sglang_supervisor.host.teardown import Survivor, TeardownReport
from sglang_supervisor.host.teardown import teardown as stop_tree
from sglang_supervisor.slurm.presence import Presence
from sglang_supervisor.slurm.settings import SlurmSettings
from sglang_supervisor.slurm.step import SlurmStep, scancel_kill

_POLL_S = 0.05
log = logging.getLogger("supervisor")


def stop_step(
    slurm: SlurmSettings,
    presence: Presence,
    step: SlurmStep | None,
    *,
    sweep_args: Sequence[str],
    grace_s: float,
    kill_timeout_s: float,
    cut_grace: Callable[[], bool] | None = None,
) -> TeardownReport:
    """Leader SIGTERM, ``grace_s``, ``scancel -s KILL`` of the step, ``kill_timeout_s``,
    then every node's sweep of ``sweep_args`` (``--tag``/``--tag-prefix``/
    ``--exclude-tag``; module docstring). Blocking; survivors are listed."""
    report = TeardownReport(grace_s=grace_s)
    start = time.monotonic()

    def cut() -> bool:
        return cut_grace is not None and cut_grace()

    if step is not None and not step.poll():
        report.launcher = step.pid
        # Who the step's processes are, from every node's last sample (no question: a
        # frozen node may not answer one); the leader's answer below adds its own look.
        report.members = [
            int(p[0])
            for node, sample in presence.latest().items()
            if node in step.nodes
            for p in sample.data.get("procs", [])
            if p[1] == step.tag
        ]
        # running -> stopping: node 0's task alone gets SIGTERM (SGLang's rank 0 drains
        # and broadcasts the shutdown to the other nodes).
        if grace_s > 0:
            try:
                leader = presence.ask(
                    ["--tag", step.tag, "--signal-leader", "TERM", "--no-gpus"],
                    step.nodes,
                )
            except GpuQueryError as exc:
                log.warning("the leader's SIGTERM was not sent (%s): scancel follows", exc)
            else:
                report.sigterm_sent = sorted(
                    int(p) for a in leader.values() for p in a.get("signalled", [])
                )
                report.members += [int(p) for a in leader.values() for p in a["members"]]
            _wait(step, start + grace_s, cut)
        if not step.poll():
            report.grace_cut = cut() and time.monotonic() < start + grace_s
            report.kill_after_s = time.monotonic() - start
            scancel_kill(slurm, step)
            report.sigkill_sent += report.members  # Slurm kills every process of the step
            _wait(step, time.monotonic() + kill_timeout_s, lambda: False)
        else:
            report.launcher_exit_s = time.monotonic() - start
    # The per-node sweep, every node of the allocation: what the step left behind.
    # Here, only our srun's own tree: tagged processes are each node's (its sweep).
    local = stop_tree(step, grace_s=0.0, kill_timeout_s=kill_timeout_s)
    _merge(report, local.to_json(), "")
    try:
        answers = presence.ask(
            [
                *sweep_args,
                "--sweep",
                "--no-gpus",
                "--kill-timeout",
                str(kill_timeout_s),
            ],
            timeout=kill_timeout_s + slurm.probe_timeout_s,
        )
    except GpuQueryError as exc:
        # Unverified is not clean: the stop fails, naming why (e.g. the job is gone).
        report.survivors.append(NodeSurvivor(f"the per-node sweep did not run: {exc}"))
        answers = {}
    for node, data in answers.items():
        _merge(report, data.get("sweep", {}), node)
    report.members = sorted(set(report.members))
    report.sigkill_sent = sorted(set(report.sigkill_sent))
    if report.survivors:
        report.ended_by = "survivors"
    else:
        report.exit_s = time.monotonic() - start
        report.ended_by = (
            "sigkill"
            if report.sigkill_sent or report.kill_after_s is not None
            else "launcher"
            if report.launcher is not None
            else "nothing"
        )
    return report


def _wait(step: process.Launch, deadline: float, cut: Callable[[], bool]) -> None:
    while not step.poll() and time.monotonic() < deadline and not cut():
        time.sleep(_POLL_S)


def _merge(report: TeardownReport, part: Mapping[str, Any], node: str) -> None:
    """Add one node's (or the local) sweep to the step's report."""
    report.members += [int(p) for p in part.get("members", [])]
    report.sigkill_sent += [int(p) for p in part.get("sigkill_sent", [])]
    where = f" on node {node}" if node else ""
    report.survivors += [NodeSurvivor(f"{s}{where}") for s in part.get("survivors", [])]


class NodeSurvivor(Survivor):
    """A survivor a node's sweep described (its pid is that node's)."""

    def __init__(self, text: str) -> None:
        super().__init__(0, "", text)

    def describe(self) -> str:
        return self.cmdline
