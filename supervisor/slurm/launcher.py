"""``ProcessOps`` for a server launched as ONE Slurm job step, one task per node.

``spawn`` runs, on this host, ``srun --overlap --nodes=N --ntasks-per-node=1
--nodelist=<the allocation's first N nodes> --kill-on-bad-exit=1 --job-name=<launch tag>
python -m sglang_supervisor.slurm.task -- <server> --dist-init-addr <node 0>:<port>``; each
task adds its ``--node-rank`` and execs the server. The handle is that local ``srun``
(``sglang_supervisor.slurm.step.SlurmStep``): it exits when the step ends, and the step
ends when any task dies (``--kill-on-bad-exit``), so a rank dying on any node is seen here
as the launcher's exit. ``spawn`` returns once the step's task runs on node 0; a step
Slurm refuses (the job's step limit, a controller that does not answer) is an ``OSError``
in srun's own words, counted (``status_json``): twice in a row (or once, when Slurm's
words say it lasts for the job's life: the step limit, the job gone), and the allocation
can no longer host the server (the daemon exits for a fresh one: docs/slurm.md).

Every question to the nodes (members, the rendezvous port's holders) goes to the per-node
presence (``sglang_supervisor.slurm.presence``): no job step of its own. ``teardown`` is
the leader-first stop (``sglang_supervisor.slurm.stop``).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from sglang_supervisor.host import ports, process
from sglang_supervisor.host.backend import ServerHandle
from sglang_supervisor.host.gpu import FOREIGN_ADVICE, GpuQueryError, foreign_holders
from sglang_supervisor.host.teardown import TeardownReport
from sglang_supervisor.slurm.allocation import Allocation, node_address
from sglang_supervisor.slurm.presence import Presence
from sglang_supervisor.slurm.probe import SlurmGpuProbe
from sglang_supervisor.slurm.settings import SlurmSettings
from sglang_supervisor.slurm.step import SlurmStep, log_tail, refused_for_good, slurm_refusal
from sglang_supervisor.slurm.stop import stop_step
from sglang_supervisor.slurm.stuck import StuckWatch, diagnosis, frozen

log = logging.getLogger("supervisor")
#: SGLang's words when one node's GPUs are taken at start (distributed/bootstrap.py:441-449).
UNBALANCED = "The memory capacity is unbalanced"
#: Refusals in a row (of the server's step, or of the presence's) that mean this
#: allocation cannot host the server any more; one is enough when Slurm's words say it
#: lasts for the job's life (its step limit, the job gone: ``step.refused_for_good``).
REFUSALS_TO_GIVE_UP = 2


def nnodes_of(argv: Sequence[str]) -> int:
    """The ``--nnodes`` the server's flags ask for (1 when absent)."""
    for i, arg in enumerate(argv):
        if arg == "--nnodes" and i + 1 < len(argv) and argv[i + 1].isdigit():
            return int(argv[i + 1])
        if arg.startswith("--nnodes=") and arg[9:].isdigit():
            return int(arg[9:])
    return 1


class SlurmProcessOps:
    """``ProcessOps`` through Slurm (module docstring)."""

    def __init__(
        self,
        slurm: SlurmSettings,
        allocation: Allocation,
        presence: Presence,
        *,
        cwd: Path | None = None,
        python: str = sys.executable,
        probe: SlurmGpuProbe | None = None,
    ) -> None:
        self.slurm = slurm
        self.allocation = allocation
        self.presence = presence
        self.cwd = cwd
        self.python = python
        #: Every node's GPUs (the same presence), for what a failed start left behind.
        self.probe = probe
        #: Node name -> its NodeAddr (``scontrol``, once per node: it does not change).
        self._addresses: dict[str, str] = {}
        #: The server's steps made, Slurm's refusals of them (in a row, the last's words).
        self.steps_made = 0
        self.refusals = 0
        self.refused_in_a_row = 0
        self.last_refusal: str | None = None
        #: The serving launch's stuck node (looked at by the watcher, on the loop).
        self._stuck = StuckWatch(slurm.stuck_after_s)
        self.stuck_reason: str | None = None

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
            addr = self._addresses.get(nodes[0])
            if addr is None:
                addr = node_address(nodes[0], self.slurm.scontrol, self.slurm.probe_timeout_s)
                self._addresses[nodes[0]] = addr
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
        """Start the server's step and return once its task runs on node 0 (or
        ``slurm.probe_timeout_s`` passed). Raises ``OSError`` when srun cannot be run or
        Slurm refuses the step (module docstring). Blocking."""
        srun, nodes = self.step_argv(argv, tag)
        launch = process.spawn(srun, env, tag=tag, log_path=log_path, cwd=self.cwd)
        step = SlurmStep(
            launch.pid,
            launch.create_time,
            tag,
            log_path,
            launch.popen,
            job_id=self.allocation.job_id,
            nodes=nodes,
        )
        self._await_step(step)
        return step

    def _await_step(self, step: SlurmStep) -> None:
        """Until the step's task runs on node 0; an srun that exits first with Slurm's
        refusal raises ``OSError`` saying so (any other early exit is the start's own
        failure: the engine explains it from the log)."""
        deadline = time.monotonic() + self.slurm.probe_timeout_s
        while time.monotonic() < deadline:
            if step.poll():
                words = slurm_refusal(log_tail(step.log_path))
                if words is None:
                    return
                self.refusals += 1
                self.refused_in_a_row += 1
                self.last_refusal = words
                log.error("Slurm refused the server's job step: %s", words)
                raise OSError(
                    f"Slurm refused the server's job step ({words}; srun exit "
                    f"{step.returncode}): no server can start in this allocation (job "
                    f"{step.job_id}) until Slurm creates steps again"
                )
            try:
                answers = self.presence.ask(["--tag", step.tag, "--no-gpus"], step.nodes[:1])
            except GpuQueryError:
                return  # cannot tell: the start's own readiness wait goes on
            # Node 0 is this host: our srun carries the tag too, the task is another pid.
            if any(set(a.get("members", [])) - {step.pid} for a in answers.values()):
                self.steps_made += 1
                self.refused_in_a_row = 0
                return
            time.sleep(0.1)

    # -- a failed start --

    def start_failure_note(self, handle: ServerHandle) -> str | None:
        """After a start that failed: what every node of the step shows now, as the
        preflight names it — a process not ours on a GPU, with its node and pid (taken
        since the preflight: SGLang then fails every node with "The memory capacity is
        unbalanced") — or None. Blocking (one question to the nodes)."""
        if not isinstance(handle, SlurmStep) or self.probe is None:
            return None
        try:
            devices = self.probe.devices()
            indices = [i for i, d in enumerate(devices) if d.uuid.partition("/")[0] in handle.nodes]
            samples = self.probe.sample(indices)
            members = self.members(None, tag=None, tag_prefix=self.presence.tag_prefix)
        except GpuQueryError as exc:
            return f"the nodes could not be looked at again: {exc}"
        foreign = foreign_holders(samples, members)
        unbalanced = any(UNBALANCED in line for line in log_tail(handle.log_path))
        if not foreign:
            return "SGLang says: The memory capacity is unbalanced" if unbalanced else None
        why = "SGLang failed every node: The memory capacity is unbalanced; " if unbalanced else ""
        return f"{why}looked at again: {'; '.join(foreign)}; {FOREIGN_ADVICE}"

    # -- a stuck node --

    def stuck(self, handle: ServerHandle) -> str | None:
        """Which node keeps the ready server's group from serving, from the nodes' last
        samples (``sglang_supervisor.slurm.stuck``), or None. Never waits: the watcher
        asks at every tick."""
        if not isinstance(handle, SlurmStep):
            return None
        self.stuck_reason = self._stuck.look(self.presence.latest(), handle.tag, handle.nodes)
        return self.stuck_reason

    def node_diagnosis(self, handle: ServerHandle) -> str | None:
        """What every node of ``handle``'s step shows now (a stopped or D-state process,
        none left, a silent presence), for the reason of a hung server. Never waits."""
        if not isinstance(handle, SlurmStep):
            return None
        silent = 3 * self.slurm.sample_interval_s + self.slurm.probe_timeout_s
        return diagnosis(
            self.presence.latest(), handle.tag, handle.nodes, self.presence.clock(), silent
        )

    def status_json(self) -> dict[str, Any]:
        """``/status``'s ``slurm``: the allocation, the per-node presence and the steps
        made or refused. Never waits (the presence's last samples)."""
        presence = self.presence.status_json()
        unusable = None
        for what, n, words in (
            ("the server's job step", self.refused_in_a_row, self.last_refusal),
            (
                "the per-node presence's step",
                presence["refused_in_a_row"],
                presence["last_refusal"],
            ),
        ):
            if n >= REFUSALS_TO_GIVE_UP or (n and refused_for_good(words)):
                unusable = f"Slurm refused {what} {n} time(s) in a row ({words})"
                break
        return {
            "job_id": self.allocation.job_id,
            "nodes": list(self.allocation.nodes),
            "presence": presence,
            "server_steps": {
                "made": self.steps_made,
                "refused": self.refusals,
                "refused_in_a_row": self.refused_in_a_row,
                "last_refusal": self.last_refusal,
            },
            "stuck": self.stuck_reason,
            # The daemon exits (status 4) for a fresh allocation: docs/slurm.md.
            "allocation_unusable": unusable,
        }

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
            answers = self.presence.ask(["--no-gpus", "--port-holders", str(port)], [node])
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
        """Who listens on the server port on the server's node 0: this host's socket table
        where the daemon runs there (the batch step on the allocation's first node), else
        that node's presence (a replica's daemon elsewhere). Raises ``PortsUnreadable``."""
        here = os.environ.get("SLURMD_NODENAME")
        node = self.allocation.nodes[0]
        if here is None or here == node:
            return ports.port_listeners(host, port)
        try:
            answers = self.presence.ask(["--no-gpus", "--port-holders", str(port)], [node])
        except GpuQueryError as exc:
            raise ports.PortsUnreadable(f"node {node}: {exc}") from exc
        return [None if p < 0 else int(p) for p in answers[node].get("port_holders", [])]

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
        answers = self.presence.ask([*tag_args(tag, tag_prefix, exclude_tag), "--no-gpus"])
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
        """The leader-first stop of the step, then every node's sweep
        (``sglang_supervisor.slurm.stop``). Blocking; survivors are listed."""
        step = handle if isinstance(handle, SlurmStep) else None
        if step is not None and grace_s > 0:
            why = frozen(self.presence.latest(), step.tag, step.nodes)
            if why is not None:
                log.warning("%s: the group cannot drain, so its stop has no grace", why)
                grace_s = 0.0
        return stop_step(
            self.slurm,
            self.presence,
            step,
            sweep_args=tag_args(tag, tag_prefix, exclude_tag),
            grace_s=grace_s,
            kill_timeout_s=kill_timeout_s,
            cut_grace=cut_grace,
        )


def tag_args(tag: str | None, tag_prefix: str | None, exclude_tag: str | None) -> list[str]:
    out = []
    for name, value in (
        ("--tag", tag),
        ("--tag-prefix", tag_prefix),
        ("--exclude-tag", exclude_tag),
    ):
        if value is not None:
            out += [name, value]
    return out
