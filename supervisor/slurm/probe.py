"""Every node's facts through Slurm: ``NodeRunner`` runs ``sglang_supervisor.slurm.nodeprobe`` on
nodes of the allocation with ``srun --overlap``; ``SlurmGpuProbe`` is the ``GpuProbe``
merging their GPUs.

The merged GPUs are numbered node by node in the allocation's order (node 0's GPUs
first), each named ``<node>/<uuid>`` (the form ``sglang_supervisor.slurm.task`` narrows
``CUDA_VISIBLE_DEVICES`` by) and its samples carry the node, so a foreign process is named
with its node. Pids are the nodes' own: members come from the same per-node probes, so a
pid is judged on the node that reported it (two nodes may report the same pid number:
then a member's number also covers the other node's process; see docs/slurm.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sglang_supervisor.host.gpu import GpuInfo, GpuProcess, GpuQueryError, GpuSample
from sglang_supervisor.host.process import TAG_ENV
from sglang_supervisor.slurm.settings import SlurmSettings

_LABELLED = re.compile(r"^\s*(\d+): (.*)$")


def parse_labelled(stdout: str, nodes: Sequence[str]) -> dict[str, Any]:
    """``{node: answer}`` from ``srun --label`` output of one JSON line per task (task i
    ran on ``nodes[i]``). srun cuts long lines into labelled pieces of about 1 KiB: a
    task's pieces, joined, are its answer; an answer that does not parse is left out."""
    pieces: dict[int, list[str]] = {}
    for line in stdout.splitlines():
        found = _LABELLED.match(line)
        if found is not None:
            pieces.setdefault(int(found.group(1)), []).append(found.group(2))
    answers: dict[str, Any] = {}
    for task, parts in pieces.items():
        try:
            data = json.loads("".join(parts))
        except ValueError:
            continue
        if 0 <= task < len(nodes):
            answers[nodes[task]] = data
    return answers


@dataclass
class NodeRunner:
    """Runs the per-node probe on nodes of allocation ``job_id`` (``nodes`` in order)."""

    slurm: SlurmSettings
    job_id: str
    nodes: tuple[str, ...]
    #: Options of every probe (the simulated GPUs' registry and size).
    probe_args: tuple[str, ...] = ()
    python: str = sys.executable

    def run(self, extra: Sequence[str], nodes: Sequence[str] | None = None) -> dict[str, Any]:
        """``{node: answer}`` of one probe per node in ``nodes`` (default: all).

        Blocking. Raises ``GpuQueryError`` naming the node when a node did not answer.
        """
        use = list(nodes or self.nodes)
        argv = [
            self.slurm.srun,
            "--overlap",
            f"--jobid={self.job_id}",
            f"--nodes={len(use)}",
            "--ntasks-per-node=1",
            f"--nodelist={','.join(use)}",
            "--label",
            "--job-name=sglang-supervisor-probe",
            *self.slurm.probe_args,
            self.python,
            "-m",
            "sglang_supervisor.slurm.nodeprobe",
            *self.probe_args,
            *extra,
        ]
        # The probe is not a member of any launch: never give it our launch tag.
        env = {k: v for k, v in os.environ.items() if k != TAG_ENV}
        t0 = time.monotonic()
        try:
            done = subprocess.run(
                argv,
                env=env,
                capture_output=True,
                text=True,
                timeout=self.slurm.probe_timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise GpuQueryError(
                f"the per-node probe on {','.join(use)} did not answer within "
                f"{self.slurm.probe_timeout_s:g}s (slurm.probe_timeout_s)"
            ) from exc
        except OSError as exc:
            raise GpuQueryError(f"cannot run {self.slurm.srun!r}: {exc}") from exc
        answers = parse_labelled(done.stdout, use)
        missing = [n for n in use if n not in answers]
        if missing:
            raise GpuQueryError(
                f"node(s) {', '.join(missing)} did not answer the per-node probe "
                f"(srun exit {done.returncode} after {time.monotonic() - t0:.1f}s): "
                f"{done.stderr.strip()[-400:] or 'no output'}"
            )
        return answers


class SlurmGpuProbe:
    """``GpuProbe`` over every node's GPUs (module docstring), through ``NodeRunner``."""

    def __init__(self, runner: NodeRunner, kind: str) -> None:
        self.runner = runner
        self.kind = kind
        self._devices: list[GpuInfo] | None = None
        #: Merged index -> (node, the node's own GPU index).
        self._where: dict[int, tuple[str, int]] = {}

    def devices(self) -> list[GpuInfo]:
        if self._devices is None:
            answers = self.runner.run([])
            devices: list[GpuInfo] = []
            for node in self.runner.nodes:
                data = answers[node]
                if "gpu_error" in data:
                    raise GpuQueryError(f"node {node}: {data['gpu_error']}")
                for g in data["gpus"]:
                    index = len(devices)
                    self._where[index] = (node, int(g["index"]))
                    devices.append(
                        GpuInfo(index, f"{node}/{g['uuid']}", g["name"], g["memory_total_bytes"])
                    )
            self._devices = devices
        return list(self._devices)

    def sample(self, indices: Sequence[int]) -> list[GpuSample]:
        """Memory and processes of the merged GPUs ``indices``, one probe per node concerned.

        Raises ``GpuQueryError`` for an unknown index or a node that did not answer.
        """
        devices = self.devices()
        for i in indices:
            if i not in self._where:
                raise GpuQueryError(
                    f"GPU {i} does not exist (the allocation's nodes have {len(devices)})"
                )
        nodes = [n for n in self.runner.nodes if any(self._where[i][0] == n for i in indices)]
        answers = self.runner.run([], nodes) if nodes else {}
        out = []
        for i in indices:
            node, local = self._where[i]
            data = answers[node]
            if "gpu_error" in data:
                raise GpuQueryError(f"node {node}: {data['gpu_error']}")
            g = next((g for g in data["gpus"] if int(g["index"]) == local), None)
            if g is None:
                raise GpuQueryError(f"node {node} no longer reports its GPU {local}")
            out.append(
                GpuSample(
                    index=i,
                    uuid=devices[i].uuid,
                    name=g["name"],
                    memory_used_bytes=int(g["memory_used_bytes"]),
                    memory_total_bytes=int(g["memory_total_bytes"]),
                    processes=tuple(GpuProcess(int(p), u) for p, u in g["processes"]),
                    node=node,
                )
            )
        return out

    def pids_are_local(self) -> bool:
        """Members and GPU processes both come from the per-node probes (docstring)."""
        return True

    def close(self) -> None:
        """Nothing held: each query is its own ``srun``."""
