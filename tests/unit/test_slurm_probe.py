"""The merged GPU probe of the slurm launcher (supervisor/slurm/probe.py), on canned node
answers: GPUs numbered node by node and named ``<node>/<uuid>``, samples carrying their
node, a node that did not answer or failed its query never read as free GPUs; and the
parsing of ``srun --label`` output, whose long lines srun cuts into labelled pieces."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from sglang_supervisor.host.gpu import GpuQueryError, foreign_holders
from sglang_supervisor.slurm.probe import NodeRunner, SlurmGpuProbe, parse_labelled
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


class CannedRunner(NodeRunner):
    def __init__(self, answers: dict[str, Any]) -> None:
        super().__init__(SlurmSettings(), "7", tuple(answers))
        self.answers = answers

    def run(self, extra: Sequence[str], nodes: Sequence[str] | None = None) -> dict[str, Any]:
        use = list(nodes or self.nodes)
        missing = [n for n in use if n not in self.answers]
        if missing:
            raise GpuQueryError(f"node(s) {', '.join(missing)} did not answer")
        return {n: self.answers[n] for n in use}


def test_gpus_are_numbered_node_by_node_and_carry_their_node() -> None:
    probe = SlurmGpuProbe(
        CannedRunner(
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
        CannedRunner({"n1": {"gpus": gpus([0])}, "n2": {"gpus": gpus([0])}}), "nvml"
    )
    probe.devices()
    # type: ignore[attr-defined]
    probe.runner.answers["n2"] = {"gpu_error": "NVML: driver not loaded"}
    with pytest.raises(GpuQueryError, match="node n2: NVML: driver not loaded"):
        probe.sample([0, 1])
    with pytest.raises(GpuQueryError, match="GPU 5 does not exist"):
        probe.sample([5])


def test_labelled_pieces_of_a_long_line_are_joined_per_task() -> None:
    long = json.dumps({"node": "n2", "pad": "x" * 3000})
    pieces = [long[i : i + 1024] for i in range(0, len(long), 1024)]
    out = "\n".join(
        [f"1: {pieces[0]}", '0: {"node": "n1"}', *(f"1: {p}" for p in pieces[1:]), "srun: noise"]
    )
    answers = parse_labelled(out, ["n1", "n2"])
    assert answers["n1"] == {"node": "n1"}
    assert answers["n2"]["pad"] == "x" * 3000
    assert parse_labelled("0: {broken", ["n1"]) == {}
