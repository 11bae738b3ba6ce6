"""Layouts SGLang 0.5.23 fails building the model for are refused in validation, before
the stop, from the model's config.json: phi-4's 10 KV heads cannot be split over 4 or 8
attention TP ranks (``sglang/srt/layers/linear.py:1139-1145``: ``divide`` asserts at
``distributed/utils.py:68-72``; ``models/llama.py:186-193``), routed experts must divide
over ``ep_size`` (``layers/moe/fused_moe_triton/layer.py:414``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor.planner.sharding import sharding_problems
from sglang_supervisor.states import ServerState
from tests.inprocess import api_client
from tests.planner_cases import MODELS
from tests.unit.fakes import FakeProbe, run

DATA = Path(__file__).resolve().parents[1] / "data" / "models"


@pytest.mark.parametrize("tp", [4, 8])
def test_phi4_at_tp4_and_tp8_is_refused_in_validation_naming_tp_size(
    tmp_path: Path, tp: int
) -> None:
    async def scenario() -> None:
        probe = FakeProbe(8)
        async with api_client(tmp_path, probe=probe) as (client, rig, _):
            pid = rig.sup.server.handle.pid if rig.sup.server else None
            levers = {"model_path": str(DATA / "phi-4"), "tp_size": tp}
            r = await client.post("/levers", json={"levers": levers})
            assert r.status_code == 422, r.text
            text = r.text
            assert "tp_size" in text and "10 KV heads" in text and "linear.py" in text
            assert rig.sup.state == ServerState.READY
            assert (rig.sup.server.handle.pid if rig.sup.server else None) == pid

    run(scenario, timeout=30)


def test_phi4_at_tp2_passes_the_layout_check() -> None:
    config: dict[str, Any] = MODELS["phi-4"]
    assert sharding_problems(config, {"tp_size": 2}, "phi-4") == []
    assert sharding_problems(config, {"tp_size": 1}, "phi-4") == []


def test_kv_heads_fewer_than_ranks_are_replicated_when_tp_divides_by_them() -> None:
    """Llama-4-Scout's 8 KV heads at TP8: 1 per rank; DeepSeek-V3 (MLA) at TP8 is fine."""
    assert sharding_problems(MODELS["Llama-4-Scout"], {"tp_size": 8}, "x") == []
    assert sharding_problems(MODELS["DeepSeek-V3"], {"tp_size": 8}, "x") == []
    # 8 KV heads over 16 ranks replicate (16 % 8 == 0); over 12 they cannot.
    assert sharding_problems(MODELS["Llama-4-Scout"], {"tp_size": 16}, "x")[0][0] == "tp_size"


def test_experts_must_divide_over_ep_size() -> None:
    """DeepSeek-V3's 256 routed experts over ep_size 8: fine; over 3: refused."""
    assert sharding_problems(MODELS["DeepSeek-V3"], {"tp_size": 8, "ep_size": 8}, "x") == []
    ((lever, msg),) = sharding_problems(MODELS["DeepSeek-V3"], {"tp_size": 8, "ep_size": 3}, "x")
    assert lever == "ep_size" and "256 routed experts" in msg and "layer.py:414" in msg


def test_the_planner_refuses_phi4_at_tp4_with_the_same_reason() -> None:
    """The planner (and so POST /plan, a 422) no longer plans a layout SGLang cannot build."""
    from sglang_supervisor import planner
    from tests.planner_cases import H200, planner_model

    hw = planner.Hardware(gpus=8, gpu_memory_bytes=H200, host_ram_available_bytes=512 << 30)
    with pytest.raises(planner.PlanError, match=r"tp_size 4 cannot split the model's 10 KV"):
        planner.propose(planner_model("phi-4"), hw, {"tp_size": 4}, avg_tokens=4096)
    plan = planner.propose(planner_model("phi-4"), hw, {"tp_size": 2}, avg_tokens=4096)
    assert plan.current.ranks == 2
