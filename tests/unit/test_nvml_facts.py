"""Real mode reads the compute capability and the driver version from NVML
(``nvmlDeviceGetCudaComputeCapability``, ``nvmlSystemGetDriverVersion``) for SGLang's
resolution, instead of a table of GPU names and no driver version."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from sglang_supervisor.engine.validation import gpu_facts
from sglang_supervisor.host.gpu import GpuInfo
from sglang_supervisor.host.nvml import NvmlProbe
from sglang_supervisor.sglang.resolution import GpuFacts
from tests.unit.fakes import make_rig
from tests.unit.test_nvml import make_pynvml


def _with_facts(m: types.ModuleType) -> types.ModuleType:
    caps = {100: (8, 6), 101: (9, 0), 102: (8, 9), 103: (9, 0)}
    m.nvmlDeviceGetCudaComputeCapability = lambda h: caps[h]  # type: ignore[attr-defined]
    m.nvmlSystemGetDriverVersion = lambda: b"580.95.05"  # type: ignore[attr-defined]
    return m


def test_devices_carry_nvmls_capability_and_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _with_facts(make_pynvml()))
    devices = NvmlProbe().devices()
    assert [d.capability for d in devices] == [(8, 6), (9, 0), (8, 9), (9, 0)]
    assert {d.driver_version for d in devices} == {"580.95.05"}


def test_an_old_nvml_without_them_leaves_them_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", make_pynvml())
    devices = NvmlProbe().devices()
    assert [d.capability for d in devices] == [None] * 4
    assert devices[1].memory_total_bytes > 0  # the rest still answers


def test_resolution_facts_come_from_nvml_not_the_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU whose name the table does not know (a future one) still gets SGLang's
    resolution, with NVML's capability and driver version."""
    rig = make_rig(tmp_path, backend_name="sglang")
    rig.sup.record.gpus_resolved(
        [GpuInfo(i, f"GPU-{i}", "NVIDIA Future GPU", 141 << 30, (10, 3), "590.1") for i in range(2)]
    )
    facts = gpu_facts(rig.sup.parts, rig.sup.managed)
    assert isinstance(facts, GpuFacts)
    assert facts.capability == (10, 3) and facts.driver_version == "590.1"
