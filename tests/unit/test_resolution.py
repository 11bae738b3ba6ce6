"""The hardware facts SGLang's resolution gets, from the managed GPUs' NVML names/memory."""

from __future__ import annotations

import pytest

from sglang_supervisor.sglang.resolution import GpuFacts, capability_from_name


@pytest.mark.parametrize(
    ("name", "cap"),
    [
        ("NVIDIA H200", (9, 0)),
        ("NVIDIA H100 80GB HBM3", (9, 0)),
        ("NVIDIA H20", (9, 0)),
        ("NVIDIA H200 (simulated)", (9, 0)),
        ("NVIDIA B200", (10, 0)),
        ("NVIDIA GB200", (10, 0)),
        ("NVIDIA B300 SXM6 AC", (10, 3)),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0)),
        ("NVIDIA A100-SXM4-80GB", (8, 0)),
        ("NVIDIA A10G", (8, 6)),
        ("NVIDIA L40S", (8, 9)),
        ("Some Future GPU", None),
    ],
)
def test_capability_from_the_nvml_name(name: str, cap: tuple[int, int] | None) -> None:
    assert capability_from_name(name) == cap


def test_facts_take_the_smallest_gpu_and_say_unknown_when_unknown() -> None:
    facts = GpuFacts.of_gpus(["NVIDIA H200"] * 2, [150_754_820_096, 140_000_000_000])
    assert facts is not None
    assert (facts.count, facts.capability, facts.memory_mib) == (2, (9, 0), 140_000_000_000 >> 20)
    assert GpuFacts.of_gpus(["Some Future GPU"], [1 << 40]) is None
    assert GpuFacts.of_gpus([], []) is None
