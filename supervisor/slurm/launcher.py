"""``ProcessOps`` for a server launched as ONE Slurm job step, one task per node.

``spawn`` runs, on this host, ``srun --overlap --nodes=N --ntasks-per-node=1
--nodelist=<the allocation's first N nodes> --kill-on-bad-exit=1 --job-name=<launch tag>
python -m sglang_supervisor.slurm.task -- <server> --dist-init-addr <node 0>:<port>``; each task
adds its ``--node-rank`` and execs the server. The handle is that local ``srun`` (a
``process.Launch``): it exits when the step ends, and the step ends when any task dies
(``--kill-on-bad-exit``), so a rank dying on any node is seen here as the launcher's exit.

``teardown``, leader first (docs/design.md: SGLang's nodes >= 1 ignore SIGTERM; rank 0 drains and
broadcasts the shutdown): SIGTERM to node 0's task alone (through the per-node probe; a
``scancel -s TERM`` would signal every process of every task, cutting requests), up to
``grace_s`` for the step to end; then ``scancel -s KILL <job>.<step>`` (Slurm kills every
process of the step on every node) and up to ``kill_timeout_s``; then the per-node sweep
of our tagged processes on every node (Slurm's process tracking may miss one that left
the step), which SIGKILLs what is left and names what survived.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_supervisor.host import ports, process
from sglang_supervisor.host.backend import ServerHandle
from sglang_supervisor.host.gpu import GpuQueryError
from sglang_supervisor.host.teardown import Survivor, TeardownReport
from sglang_supervisor.host.teardown import teardown as stop_tree
from sglang_supervisor.slurm.allocation import Allocation, node_address
from sglang_supervisor.slurm.probe import NodeRunner
from sglang_supervisor.slurm.settings import SlurmSettings

_POLL_S = 0.05
log = logging.getLogger("supervisor")


def nnodes_of(argv: Sequence[str]) -> int:
    """The ``--nnodes`` the server's flags ask for (1 when absent)."""
    for i, arg in enumerate(argv):
        if arg == "--nnodes" and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if arg.startswith("--nnodes=") and arg[9:].isdigit():
            return int(arg[9:])
    return 1


@dataclass
class SlurmStep(process.Launch):
    """The local ``srun`` of one server step, with the nodes it runs on."""

    job_id: str = ""
    nodes: tuple[str, ...] = ()


class SlurmProcessOps:
    """``ProcessOps`` through Slurm (module docstring)."""

    def __init__(
        self,
        slurm: SlurmSettings,
        allocation: Allocation,
        runner: NodeRunner,
        *,
        cwd: Path | None = None,
        python: str = sys.executable,
    ) -> None:
        self.slurm = slurm
        self.allocation = allocation
        self.runner = runner
        self.cwd = cwd
        self.python = python

    # -- launch --

    def step_argv(self, argv: Sequence[str], tag: str) -> tuple[list[str], tuple[str, ...]]:
        """The ``srun`` command for ``argv`` and the nodes its step runs on."""
        n = nnodes_of(argv)
        nodes = self.allocation.nodes[:n]
        if len(nodes) < n:
            raise OSError(
                f"cannot start the server on {n} nodes: the allocation (job "
                f"{self.allocation.job_id}) has {len(self.allocation.nodes)}"
            )
        server = list(argv)
        if n > 1:
            addr = node_address(nodes[0], self.slurm.scontrol, self.slurm.probe_timeout_s)
            server += ["--dist-init-addr", f"{addr}:{self.slurm.dist_init_port}"]
        srun = [
            self.slurm.srun,
            "--overlap",
            f"--jobid={self.allocation.job_id}",
            f"--nodes={n}",
            "--ntasks-per-node=1",
            f"--nodelist={','.join(nodes)}",
            "--kill-on-bad-exit=1",
            f"--job-name={tag}",
            *self.slurm.extra_args,
            self.python,
            "-m",
            "sglang_supervisor.slurm.task",
            "--",
            *server,
        ]
        return srun, nodes

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], *, tag: str, log_path: Path
    ) -> ServerHandle:
        """Start the server's step; raises ``OSError`` when srun cannot be run."""
        srun, nodes = self.step_argv(argv, tag)
        launch = process.spawn(srun, env, tag=tag, log_path=log_path, cwd=self.cwd)
        return SlurmStep(
            launch.pid,
            launch.create_time,
            tag,
            log_path,
            launch.popen,
            job_id=self.allocation.job_id,
            nodes=nodes,
        )

    def adopt(self, pid: int, create_time: float, tag: str, log_path: Path) -> ServerHandle | None:
        """The ``srun`` an earlier daemon on this host started, if it still runs."""
        found = process.adopt(pid, create_time, tag, log_path)
        if found is None:
            return None
        return SlurmStep(
            pid,
            create_time,
            tag,
            log_path,
            job_id=self.allocation.job_id,
            nodes=self.allocation.nodes,
        )

    # -- preflight --

    def preflight_problems(
        self, levers: Mapping[str, Any], members: Collection[int]
    ) -> list[tuple[str, str]]:
        """What would fail the group's start on a node, before anything is stopped:
        SGLang's rendezvous port (``--dist-init-addr``) on node 0 held by a process not
        ours. Blocking; a node that does not answer is a problem too."""
        nnodes = int(levers.get("nnodes") or 1)
        if nnodes <= 1:
            return []
        node, port = self.allocation.nodes[0], self.slurm.dist_init_port
        try:
            answers = self.runner.run(["--no-gpus", "--port-holders", str(port)], [node])
        except GpuQueryError as exc:
            return [("slurm.dist_init_port", f"cannot check port {port} on node {node}: {exc}")]
        held = [p for p in answers[node].get("port_holders", []) if p not in members]
        if not held:
            return []
        who = ", ".join("a process we may not see" if p < 0 else f"pid {p}" for p in held)
        return [
            (
                "slurm.dist_init_port",
                f"port {port} on node {node}, the group's rendezvous (--dist-init-addr), is "
                f"held by {who}, not ours: every node would fail to start; stop it or set "
                "another slurm.dist_init_port",
            )
        ]

    def port_listeners(self, host: str, port: int) -> list[int | None]:
        """Who listens on the server port: node 0 serves HTTP, and the daemon runs on node
        0 (the allocation's batch step), so this host's socket table answers."""
        return ports.port_listeners(host, port)

    # -- members --

    def members(
        self,
        handle: ServerHandle | None,
        *,
        tag: str | None,
        tag_prefix: str | None,
        exclude_tag: str | None = None,
    ) -> set[int]:
        """The local srun's tree and every node's processes carrying the tag."""
        launch = handle if isinstance(handle, process.Launch) else None
        found = set(
            process.find_members(launch, tag=tag, tag_prefix=tag_prefix, exclude_tag=exclude_tag)
        )
        answers = self.runner.run([*_tag_args(tag, tag_prefix, exclude_tag), "--no-gpus"])
        for data in answers.values():
            found.update(int(p) for p in data.get("members", []))
        return found

    # -- teardown --

    def teardown(
        self,
        handle: ServerHandle | None,
        *,
        tag: str | None,
        tag_prefix: str | None,
        grace_s: float,
        kill_timeout_s: float,
        exclude_tag: str | None = None,
        cut_grace: Callable[[], bool] | None = None,
    ) -> TeardownReport:
        """Leader SIGTERM, ``grace_s``, ``scancel -s KILL`` of the step, ``kill_timeout_s``,
        then the per-node sweep (module docstring). Blocking; survivors are listed."""
        step = handle if isinstance(handle, SlurmStep) else None
        report = TeardownReport(grace_s=grace_s)
        start = time.monotonic()

        def cut() -> bool:
            return cut_grace is not None and cut_grace()

        if step is not None and not step.poll():
            report.launcher = step.pid
            # running -> stopping: node 0's task alone gets SIGTERM (SGLang's rank 0 drains
            # and broadcasts the shutdown to the other nodes).
            if grace_s > 0:
                try:
                    leader = self.runner.run(
                        ["--tag", step.tag, "--signal-leader", "TERM", "--no-gpus"],
                        step.nodes,
                    )
                except GpuQueryError as exc:
                    log.warning("the leader's SIGTERM was not sent (%s): scancel follows", exc)
                else:
                    report.sigterm_sent = sorted(
                        int(p) for a in leader.values() for p in a.get("signalled", [])
                    )
                    report.members = [int(p) for a in leader.values() for p in a["members"]]
                _wait(step, start + grace_s, cut)
            if not step.poll():
                report.grace_cut = cut() and time.monotonic() < start + grace_s
                report.kill_after_s = time.monotonic() - start
                self._scancel_kill(step)
                _wait(step, time.monotonic() + kill_timeout_s, lambda: False)
            else:
                report.launcher_exit_s = time.monotonic() - start
        # The per-node sweep, every node of the allocation: what the step left behind.
        # Here, only our srun's own tree: tagged processes are each node's (its sweep).
        local = stop_tree(step, grace_s=0.0, kill_timeout_s=kill_timeout_s)
        _merge(report, local.to_json(), "")
        try:
            answers = self.runner.run(
                [
                    *_tag_args(tag, tag_prefix, exclude_tag),
                    "--sweep",
                    "--no-gpus",
                    "--kill-timeout",
                    str(kill_timeout_s),
                ]
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

    def _scancel_kill(self, step: SlurmStep) -> None:
        """``scancel -s KILL`` of the step named by the launch tag (every node's tasks)."""
        ids = _step_ids(self.slurm, step.job_id, step.tag)
        for step_id in ids:
            subprocess.run(
                [self.slurm.scancel, "-s", "KILL", step_id],
                capture_output=True,
                timeout=self.slurm.probe_timeout_s,
                check=False,
            )
        if not ids:  # the step is not listed (yet): kill our srun, Slurm ends its step
            with contextlib.suppress(ProcessLookupError):
                os.kill(step.pid, signal.SIGKILL)


def _wait(step: process.Launch, deadline: float, cut: Callable[[], bool]) -> None:
    while not step.poll() and time.monotonic() < deadline and not cut():
        time.sleep(_POLL_S)


def _tag_args(tag: str | None, tag_prefix: str | None, exclude_tag: str | None) -> list[str]:
    out = []
    for name, value in (
        ("--tag", tag),
        ("--tag-prefix", tag_prefix),
        ("--exclude-tag", exclude_tag),
    ):
        if value is not None:
            out += [name, value]
    return out


def _step_ids(slurm: SlurmSettings, job_id: str, name: str) -> list[str]:
    """``job.step`` ids of the running steps of ``job_id`` named ``name``."""
    squeue = str(Path(slurm.scancel).with_name("squeue")) if "/" in slurm.scancel else "squeue"
    done = subprocess.run(
        [squeue, "-h", "-s", "-j", job_id, "-o", "%i %j"],
        capture_output=True,
        text=True,
        timeout=slurm.probe_timeout_s,
        check=False,
    )
    out = []
    for line in done.stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[1].strip() == name:
            out.append(parts[0])
    return out


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
