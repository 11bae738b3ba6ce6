"""Every node's GPUs as one ``GpuProbe``: ``SlurmGpuProbe`` asks the per-node presence
(``sglang_supervisor.slurm.presence``) and merges the nodes' answers.

The merged GPUs are numbered node by node in the allocation's order (node 0's GPUs
first), each named ``<node>/<uuid>`` (the form ``sglang_supervisor.slurm.task`` narrows
``CUDA_VISIBLE_DEVICES`` by) and its samples carry the node, so a foreign process is named
with its node. Pids are the nodes' own: members come from the same presence, so a pid is
judged on the node that reported it (two nodes may report the same pid number: then a
member's number also covers the other node's process; see docs/slurm.md).

``sample`` is a fresh look (an operation's preflight, the release wait): it waits for
every node concerned, up to ``slurm.probe_timeout_s``. ``recent`` is what a reader gets
(``/status``, ``/metrics``): each node's last sample with its age, never waiting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang_supervisor.host.gpu import GpuInfo, GpuProcess, GpuQueryError, GpuSample
from sglang_supervisor.slurm.presence import NodeSample, Presence


@dataclass(frozen=True)
class RecentGpus:
    """The managed GPUs as each node last sampled them (``SlurmGpuProbe.recent``)."""

    #: One per GPU whose node has sampled it, with the sample's ``age_s``.
    samples: list[GpuSample]
    #: Our processes in those same samples (every launch of this instance).
    members: set[int]
    #: GPU index -> why it has no sample (its node has not answered yet, or its query failed).
    errors: Mapping[int, str] = field(default_factory=dict)


def _gpu_sample(
    index: int, uuid: str, g: Mapping[str, Any], node: str, age_s: float | None = None
) -> GpuSample:
    return GpuSample(
        index=index,
        uuid=uuid,
        name=g["name"],
        memory_used_bytes=int(g["memory_used_bytes"]),
        memory_total_bytes=int(g["memory_total_bytes"]),
        processes=tuple(GpuProcess(int(p), u) for p, u in g["processes"]),
        node=node,
        age_s=age_s,
    )


class SlurmGpuProbe:
    """``GpuProbe`` over every node's GPUs (module docstring)."""

    def __init__(self, presence: Presence, kind: str) -> None:
        self.presence = presence
        self.kind = kind
        self._devices: list[GpuInfo] | None = None
        #: Merged index -> (node, the node's own GPU index).
        self._where: dict[int, tuple[str, int]] = {}

    def devices(self) -> list[GpuInfo]:
        if self._devices is None:
            answers = self.presence.ask([])
            devices: list[GpuInfo] = []
            for node in self.presence.nodes:
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

    def _nodes_of(self, indices: Sequence[int]) -> list[str]:
        devices = self.devices()
        for i in indices:
            if i not in self._where:
                raise GpuQueryError(
                    f"GPU {i} does not exist (the allocation's nodes have {len(devices)})"
                )
        return [n for n in self.presence.nodes if any(self._where[i][0] == n for i in indices)]

    def sample(self, indices: Sequence[int]) -> list[GpuSample]:
        """Memory and processes of the merged GPUs ``indices`` now: one question to the
        nodes concerned, answered by all of them at once.

        Raises ``GpuQueryError`` for an unknown index or a node that did not answer."""
        nodes = self._nodes_of(indices)
        answers = self.presence.ask([], nodes) if nodes else {}
        devices = self.devices()
        out = []
        for i in indices:
            node, local = self._where[i]
            data = answers[node]
            if "gpu_error" in data:
                raise GpuQueryError(f"node {node}: {data['gpu_error']}")
            g = next((g for g in data["gpus"] if int(g["index"]) == local), None)
            if g is None:
                raise GpuQueryError(f"node {node} no longer reports its GPU {local}")
            out.append(_gpu_sample(i, devices[i].uuid, g, node))
        return out

    def recent(self, indices: Sequence[int]) -> RecentGpus:
        """The GPUs ``indices`` as their nodes last sampled them, each with its age, and
        our processes in those samples; never waits on a node (a GPU whose node has no
        sample, or an unknown index, is an error entry)."""
        latest = self.presence.latest()
        now = self.presence.clock()
        samples: list[GpuSample] = []
        members: set[int] = set()
        errors: dict[int, str] = {}
        devices = self._devices or []
        for s in latest.values():
            members.update(int(p[0]) for p in s.data.get("procs", []))
        for i in indices:
            if i not in self._where or i >= len(devices):
                errors[i] = f"GPU {i} is not known (yet) on the allocation's nodes"
                continue
            node, local = self._where[i]
            got: NodeSample | None = latest.get(node)
            if got is None:
                errors[i] = f"node {node} has not sampled its GPUs yet (the per-node presence)"
                continue
            if "gpu_error" in got.data:
                errors[i] = f"node {node}: {got.data['gpu_error']}"
                continue
            g = next((g for g in got.data.get("gpus", []) if int(g["index"]) == local), None)
            if g is None:
                errors[i] = f"node {node} no longer reports its GPU {local}"
                continue
            samples.append(_gpu_sample(i, devices[i].uuid, g, node, max(0.0, now - got.at)))
        return RecentGpus(samples, members, errors)

    def pids_are_local(self) -> bool:
        """Members and GPU processes both come from the per-node presence (docstring)."""
        return True

    def close(self) -> None:
        """End the presence (its step ends with it). Blocking."""
        self.presence.close()
