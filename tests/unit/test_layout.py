"""One definition of SGLang 0.5.23's parallel layout, used by preflight, planner and sim.

Expected numbers come from SGLang 0.5.23's own code (paths under ``sglang/srt/``):
``server_args.py:581-589`` (``compute_world_size``: dp × tp × pp, attention DP adds no GPU),
``arg_groups/parallel_hook.py:39-61`` (the deprecated ``--enable-dp-attention --dp-size N``
becomes ``--attn-dp-size N`` with ``dp_size`` 1), ``:287-292`` (replicas with attention DP
refused), ``:326`` (tp divisible by attn_dp), ``managers/data_parallel_controller.py:445-449``
and ``:747-752`` (a rank's GPU id), ``entrypoints/engine.py:932-939`` (the same without
replicas), ``arg_groups/validation_hook.py:204-205`` (base_gpu_id ≥ 0, gpu_id_step ≥ 1).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from sglang_supervisor import planner
from sglang_supervisor.host import preflight
from sglang_supervisor.host.gpu import GpuInfo
from sglang_supervisor.sglang.layout import Layout, size_problems
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.sim.server import ServerConfig, build_parser

H200 = 143771 * 2**20


def _gpus(n: int) -> list[GpuInfo]:
    return [
        GpuInfo(index=i, uuid=f"GPU-{i}", name="NVIDIA H200", memory_total_bytes=H200)
        for i in range(n)
    ]


def _check(levers: dict[str, Any], gpus: int) -> list[str]:
    problems = preflight.check(
        LeverSet({"model_path": "m", **levers}),
        managed=_gpus(gpus),
        samples=None,
        member_pids=set(),
        pids_are_local=False,
        host=preflight.HostFacts(2000 * 2**30, "simulated"),
        freed_on_stop_bytes=0,
        server_host="127.0.0.1",
        server_port=1,
        port_is_ours=True,
    )
    return [f"{p.lever}: {p.message}" for p in problems]


def _ids(shape: Layout) -> tuple[int, ...]:
    return tuple(shape.gpu_id(r) for r in range(shape.ranks))


def _sim_ranks(argv: list[str]) -> tuple[int, tuple[int, ...]]:
    cfg = ServerConfig.from_namespace(build_parser().parse_args(["--model-path", "m", *argv]))
    return cfg.num_ranks, _ids(cfg.layout)


@pytest.mark.parametrize(
    ("levers", "ranks", "gpus", "attn_dp", "ids"),
    [
        ({}, 1, 1, 1, (0,)),
        ({"tp_size": 8}, 8, 8, 1, tuple(range(8))),
        # compute_world_size: dp replicas each take tp × pp GPUs.
        ({"tp_size": 2, "dp_size": 4}, 8, 8, 1, tuple(range(8))),
        # Attention DP (new spelling) adds no GPU and no rank.
        ({"tp_size": 8, "attn_dp_size": 8}, 8, 8, 8, tuple(range(8))),
        # The deprecated spelling resolves to the same layout (parallel_hook.py:52-58).
        ({"tp_size": 8, "dp_size": 8, "enable_dp_attention": True}, 8, 8, 8, tuple(range(8))),
        ({"tp_size": 2, "dp_size": 2, "enable_dp_attention": True}, 2, 2, 2, (0, 1)),
        # base_gpu_id shifts every id; gpu_id_step spaces the TP ranks.
        ({"tp_size": 2, "base_gpu_id": 4}, 2, 6, 1, (4, 5)),
        ({"tp_size": 4, "gpu_id_step": 2}, 4, 7, 1, (0, 2, 4, 6)),
        # Replicas start tp × pp × step apart (data_parallel_controller.py:445-449).
        ({"tp_size": 2, "dp_size": 2, "gpu_id_step": 2}, 4, 7, 1, (0, 2, 4, 6)),
        # PP ranks are tp apart, not multiplied by the step (data_parallel_controller.py:749).
        ({"tp_size": 2, "pp_size": 2, "gpu_id_step": 2}, 4, 5, 1, (0, 2, 2, 4)),
    ],
)
def test_layout_matches_sglang_placement(
    levers: dict[str, Any], ranks: int, gpus: int, attn_dp: int, ids: tuple[int, ...]
) -> None:
    shape = Layout.of(levers)
    assert (shape.ranks, shape.gpus_needed, shape.attn_dp_size, _ids(shape)) == (
        ranks,
        gpus,
        attn_dp,
        ids,
    )


def test_colliding_gpu_ids_are_reported_as_ranks_per_gpu() -> None:
    assert Layout.of({"tp_size": 2, "pp_size": 2, "gpu_id_step": 2}).ranks_per_gpu == 2
    assert Layout.of({"tp_size": 8}).ranks_per_gpu == 1


def test_preflight_planner_and_sim_agree_on_attention_dp() -> None:
    """The deprecated spelling on 8 GPUs: 8 ranks everywhere, not 64 (issue 14)."""
    levers = {"tp_size": 8, "dp_size": 8, "enable_dp_attention": True}
    assert _check(levers, 8) == []
    assert preflight.ranks(levers) == 8
    assert _sim_ranks(["--tp-size", "8", "--dp-size", "8", "--enable-dp-attention"]) == (
        8,
        tuple(range(8)),
    )
    assert _sim_ranks(["--tp-size", "8", "--attn-dp-size", "8"])[0] == 8
    model = planner.model_from_config(
        {
            "architectures": ["DeepseekV3ForCausalLM"],
            "num_hidden_layers": 61,
            "num_attention_heads": 128,
            "num_key_value_heads": 128,
            "hidden_size": 7168,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
        },
        name="dsv3",
        source="inline",
        weight_bytes=688_000_000_000,
    )
    hw = planner.Hardware(gpus=8, gpu_memory_bytes=H200, host_ram_available_bytes=0)
    plan = planner.propose(model, hw, levers, avg_tokens=4096)
    assert plan.current.ranks == 8


def test_preflight_refuses_what_sglang_refuses_and_names_the_lever() -> None:
    # More GPUs than managed: the message shows the arithmetic.
    (msg,) = _check({"tp_size": 4, "gpu_id_step": 2}, 4)
    assert msg.startswith("tp_size: tp_size 4 × pp_size 1 × dp_size 1 = 4 ranks on GPU ids")
    assert "needs 7 GPUs" in msg
    # Replicas with attention DP (parallel_hook.py:287-292).
    assert any(
        m.startswith("attn_dp_size: dp_size 2 with attn_dp_size 4")
        for m in _check({"tp_size": 4, "dp_size": 2, "attn_dp_size": 4}, 8)
    )
    # tp not divisible by attn_dp (parallel_hook.py:326).
    assert any(
        "tp_size 8 is not divisible by attn_dp_size 3" in m
        for m in _check({"tp_size": 8, "attn_dp_size": 3}, 8)
    )
    # Two attention-DP ranks on 2 GPUs fit.
    assert _check({"tp_size": 2, "dp_size": 2, "enable_dp_attention": True}, 2) == []
    # Without attention DP, dp_size 2 × tp 2 needs 4.
    assert "needs 4 GPUs" in _check({"tp_size": 2, "dp_size": 2}, 2)[0]


def test_host_pool_is_pinned_once_per_rank_not_per_attention_dp_group() -> None:
    levers = {
        "tp_size": 8,
        "dp_size": 8,
        "enable_dp_attention": True,
        "enable_hierarchical_cache": True,
        "hicache_size": 10,
    }
    assert preflight.pinned_host_bytes(levers, H200) == 8 * 10 * preflight.GB


@pytest.mark.parametrize("tp", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("pp", [1, 2, 3, 5])
@pytest.mark.parametrize("step", [1, 2, 3, 4, 6])
def test_ranks_per_gpu_is_computed_as_counting_would(tp: int, pp: int, step: int) -> None:
    """The closed form (no enumeration: the sizes come from requests) against a count."""
    shape = Layout.of({"tp_size": tp, "pp_size": pp, "dp_size": 2, "gpu_id_step": step})
    counted = Counter(_ids(shape))
    assert shape.ranks_per_gpu == max(counted.values())
    assert shape.gpus_needed == max(counted) + 1


@pytest.mark.parametrize(
    ("levers", "lever"),
    [
        ({"tp_size": 10**12}, "tp_size"),
        ({"tp_size": 1000, "pp_size": 1000, "dp_size": 1000}, "tp_size"),
        ({"dp_size": 2000}, "dp_size"),
        ({"tp_size": 8, "pp_size": 8, "dp_size": 32}, "dp_size"),
    ],
)
def test_absurd_sizes_are_refused_without_sizing_anything(
    levers: dict[str, Any], lever: str
) -> None:
    """Arithmetic only: a layout of 10**12 ranks answers at once (issue 19 §1)."""
    shape = Layout.of(levers)
    assert shape.gpus_needed == shape.gpu_id(shape.ranks - 1) + 1
    assert shape.gpu_ids_outside(8)  # names an id without walking the ranks
    assert "ranks" in shape.describe()
    assert lever in [name for name, _ in size_problems(levers)]
