"""The merged GPU probe of the slurm launcher (supervisor/slurm/probe.py), on canned node
answers: GPUs numbered node by node and named ``<node>/<uuid>``, samples carrying their
node, a node that did not answer or failed its query never read as free GPUs, and what a
reader gets without waiting: each node's last sample with its age (the presence itself,
with srun's labelled pieces, is tests/unit/test_slurm_presence.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from sglang_supervisor.host.gpu import GpuQueryError, foreign_holders
from sglang_supervisor.slurm.presence import NodeSample, Presence
from sglang_supervisor.slurm.probe import SlurmGpuProbe
from sglang_supervisor.slurm.settings import SlurmSettings


def gpus(used: list[int], procs: dict[int, list[list[int]]] | None = None) -> list[dict[str, Any]]:
    return [
        {
            "index": i,
            "uuid": f"GPU-{i}",
            "name": "NVIDIA H200",
            "memory_used_bytes": u,
            "memory_total_bytes": 100,
            "processes": (procs or {}).get(i, []),
        }
        for i, u in enumerate(used)
    ]


class CannedPresence(Presence):
    """Answers from ``answers``; the last samples are ``samples`` (taken at ``at``)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        super().__init__(SlurmSettings(), "7", tuple(answers), tag_prefix="t.", clock=lambda: 100.0)
        self.answers = answers
        self.samples: dict[str, NodeSample] = {}

    def ask(
        self, argv: Sequence[str], nodes: Sequence[str] | None = None, timeout: float | None = None
    ) -> dict[str, Any]:
        use = list(nodes or self.nodes)
        missing = [n for n in use if n not in self.answers]
        if missing:
            raise GpuQueryError(f"node(s) {', '.join(missing)} did not answer")
        return {n: self.answers[n] for n in use}

    def latest(self) -> dict[str, NodeSample]:
        return dict(self.samples)


def test_gpus_are_numbered_node_by_node_and_carry_their_node() -> None:
    probe = SlurmGpuProbe(
        CannedPresence(
            {"n1": {"gpus": gpus([0, 0])}, "n2": {"gpus": gpus([0, 30], {1: [[42, 30]]})}}
        ),
        "nvml",
    )
    assert [(d.index, d.uuid) for d in probe.devices()] == [
        (0, "n1/GPU-0"), (1, "n1/GPU-1"), (2, "n2/GPU-0"), (3, "n2/GPU-1"),
    ]  # fmt: skip
    samples = probe.sample([1, 3])
    assert [(s.index, s.node, s.memory_used_bytes) for s in samples] == [
        (1, "n1", 0),
        (3, "n2", 30),
    ]
    assert foreign_holders(samples, members=set()) == ["pid 42 holds 0.0 GiB on GPU 3 (node n2)"]


def test_a_failed_query_on_one_node_is_an_error_not_a_free_gpu() -> None:
    probe = SlurmGpuProbe(
        CannedPresence({"n1": {"gpus": gpus([0])}, "n2": {"gpus": gpus([0])}}), "nvml"
    )
    probe.devices()
    # type: ignore[attr-defined]
    probe.presence.answers["n2"] = {"gpu_error": "NVML: driver not loaded"}
    with pytest.raises(GpuQueryError, match="node n2: NVML: driver not loaded"):
        probe.sample([0, 1])
    with pytest.raises(GpuQueryError, match="GPU 5 does not exist"):
        probe.sample([5])


def test_readers_get_each_nodes_last_sample_with_its_age() -> None:
    presence = CannedPresence({"n1": {"gpus": gpus([0, 0])}, "n2": {"gpus": gpus([0, 0])}})
    probe = SlurmGpuProbe(presence, "nvml")
    probe.devices()
    # Before any sample: each GPU says its node has not sampled, nothing is read as free.
    first = probe.recent([0, 1, 2, 3])
    assert first.samples == []
    assert first.errors[2] == "node n2 has not sampled its GPUs yet (the per-node presence)"
    presence.samples = {
        "n1": NodeSample("n1", {"gpus": gpus([5, 0]), "procs": [[11, "t.a", "sleeping", 1]]}, 99.5),
        "n2": NodeSample("n2", {"gpus": gpus([0, 7], {1: [[42, 7]]}), "procs": []}, 70.0),
    }
    got = probe.recent([0, 1, 2, 3])
    assert [(s.index, s.node, s.memory_used_bytes, s.age_s) for s in got.samples] == [
        (0, "n1", 5, 0.5), (1, "n1", 0, 0.5), (2, "n2", 0, 30.0), (3, "n2", 7, 30.0),
    ]  # fmt: skip
    assert got.members == {11} and not got.errors
    presence.samples["n2"] = NodeSample("n2", {"gpu_error": "NVML: Unknown Error"}, 99.0)
    assert probe.recent([3]).errors == {3: "node n2: NVML: Unknown Error"}
