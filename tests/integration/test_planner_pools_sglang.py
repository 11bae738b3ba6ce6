"""The planner's KV pools against SGLang 0.5.23's own sizing: for every case of
tests/planner_cases.py (the models of docs/planner.md: Kimi-K2.5 and K2, DeepSeek-V3,
V3.1 and V3.2, GLM-4.5, 4.6 and 5, gpt-oss, Qwen3-235B, Qwen3-Coder-480B, MiniMax-M2,
Llama-3.1-405B FP8, Llama-4 Scout and Maverick, gemma-3, Qwen3-Next) and two paged ones,
SGLang's own code runs on CPU with an H200 supplied (``scripts/sglang-pool-oracle.py``):
its resolution pipeline (the fraction, the vision tower's cut included), its KV budget
from the weights one rank loads (``KVCacheConfigurator._profile_available_bytes``,
``mem_cache/kv_cache_configurator.py:2990-3060``: the slack outside the fraction and the
multimodal cache), its pool configurator (``model_executor/pool_configurator.py``:
``create_memory_pool_configurator`` :1715-1725, ``calculate_pool_sizes`` :637-646 and
:907-916, the cells at :340-634 and :656-803) and its request cap
(``resolve_max_num_reqs``, ``kv_cache_configurator.py:3119-3173``). The planner's
fraction, bytes per token, ``max_total_num_tokens``, SWA pool and ``max_running_requests``
must be SGLang's.

Not compared here (the oracle does not build them): the speculative draft's cell and the
pipeline-parallel stage split (their cases are checked against the formulas in
tests/unit/test_planner_sglang.py); the Mamba state pool of Qwen3-Next, which SGLang sizes
in ``mem_cache/kv_cache_configurator.py:3229-3408``: its KV pool is sized from the budget
the planner leaves after the state pool. The weights one rank loads are the planner's (a
CPU host loads none): a shared input, not a figure checked here.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor import planner
from sglang_supervisor.sglang.levers import LeverSet, check_levers, render_argv
from sglang_supervisor.sglang.schema import load_bundled
from tests.planner_cases import CASES, DSV3_MTP, H200, MODELS, WEIGHTS, Case, planner_model
from tests.sglang_env import ENV, SGLANG_PYTHON, needs_sglang

#: One SGLang process sizes every case (27 resolutions, ≈80 s alone here, minutes beside
#: other workers on a loaded 2-core host): its fixture outlives pytest's 180 s default.
pytestmark = [*needs_sglang(), pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
SCHEMA = load_bundled()

COMPARED = [
    c for c in CASES if "speculative_algorithm" not in c.levers and "pp_size" not in c.levers
] + [
    Case(
        "DeepSeek-V3 TP8 page 64",
        "DeepSeek-V3",
        {"tp_size": 8, "page_size": 64},
        fraction=0.886,
        cell=(512 + 64) * 61 * 2,
        weights_per_rank=(WEIGHTS["DeepSeek-V3"] - DSV3_MTP) // 8,
        why="whole pages",
        source="pool_configurator.py:641-646",
        page=64,
    ),
    Case(
        "gpt-oss-120b TP8 page 16",
        "gpt-oss-120b",
        {"tp_size": 8, "page_size": 16},
        fraction=0.893,
        cell=8294.4,
        weights_per_rank=WEIGHTS["gpt-oss-120b"] // 8,
        why="whole pages in both pools",
        source="pool_configurator.py:879-881",
        page=16,
    ),
]


@pytest.fixture(scope="module")
def sglang_pools(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("models")
    for name, config in MODELS.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
    batch = []
    for case in COMPARED:
        p = planner.pools(planner_model(case.model), case.levers, H200)
        levers = {"model_path": str(root / case.model), **case.levers}
        argv = render_argv(check_levers(LeverSet(levers), SCHEMA, complete=True), SCHEMA)
        if p.cells.mamba_state_bytes:
            batch.append({"budget": p.kv_budget_bytes, "argv": argv})
        else:
            batch.append({"weights": p.weight_bytes_per_rank, "argv": argv})
    run = subprocess.run(
        [SGLANG_PYTHON, str(ROOT / "scripts" / "sglang-pool-oracle.py"), "--batch"],
        input=json.dumps(batch),
        capture_output=True,
        text=True,
        timeout=540,
        env=ENV,
        cwd=str(tmp_path_factory.mktemp("cwd")),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    answers = json.loads(run.stdout.strip().splitlines()[-1])
    return {case.name: answer for case, answer in zip(COMPARED, answers, strict=True)}


@pytest.mark.parametrize("case", COMPARED, ids=lambda c: c.name)
def test_planner_pools_are_sglangs(sglang_pools: dict[str, dict[str, Any]], case: Case) -> None:
    sglang = sglang_pools[case.name]
    p = planner.pools(planner_model(case.model), case.levers, H200)
    assert sglang["mem_fraction_static"] == p.mem_fraction_static == case.fraction
    assert sglang["cell_size"] == pytest.approx(p.cells.exact, rel=1e-12)
    if not p.cells.mamba_state_bytes:
        assert sglang["budget_bytes"] == p.kv_budget_bytes
        assert sglang["mm_reserved_bytes"] == case.mm_reserve
        assert sglang["max_running_requests"] == p.max_running_requests
    assert sglang["max_total_num_tokens"] == p.kv_tokens == case.kv_tokens()
    if p.cells.swa_layers:
        assert sglang["configurator"] == "HybridSWAPoolConfigurator"
        assert sglang["swa_max_total_num_tokens"] == p.swa_tokens
    if case.max_running is not None:
        assert p.max_running_requests == case.max_running
