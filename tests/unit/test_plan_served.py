"""``POST /plan`` starts from what the running server says about its own sizing
(``planner.served``): its ``max_total_num_tokens`` (``/server_info``) and, from its launch
log, the fraction SGLang resolved and the weights it loaded. In process, over the fakes:
the fake server answers ``/server_info`` with the pool a real Kimi-K2.5 deployment once
logged (116,171 tokens where the formula says ≈670K) and writes SGLang 0.5.23's start-up
lines to its log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor import planner
from sglang_supervisor.planner.served import LaunchLog, read_launch_log, with_served
from tests.inprocess import api_client
from tests.planner_cases import H200, planner_model
from tests.unit.fakes import Behaviour, FakeProbe, FakeProcessOps, run

KIMI = str(Path(__file__).resolve().parents[1] / "data" / "models" / "kimi-k2.5")
#: SGLang 0.5.23's own lines (entrypoints/engine.py:311, model_runner.py:1372-1379,
#: memory_pool.py:2097), as a TP8 Kimi-K2.5 server logs them.
LOG = [
    "[2026-02-01 10:00:00] server_args={'model_path': 'moonshotai/Kimi-K2.5', 'tp_size': 8, "
    "'mem_fraction_static': 0.8060263867187499, 'chunked_prefill_size': 8192}",
    "[2026-02-01 10:03:10 TP0] Load weight end. elapsed=190.12 s, "
    "type=KimiK25ForConditionalGeneration, avail mem=57.15 GB, mem usage=83.27 GB.",
    "[2026-02-01 10:03:12 TP0] KV Cache is allocated. #tokens: 116171, KV size: 7.60 GB",
]


def test_the_launch_log_gives_the_servers_fraction_weights_and_pool(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_text("\n".join(["noise", *LOG, "more noise"]) + "\n")
    log = read_launch_log(path)
    assert log == LaunchLog(0.8060263867187499, int(83.27 * (1 << 30)), 116_171)
    assert read_launch_log(tmp_path / "missing.log") == LaunchLog()


def test_the_served_set_gets_the_servers_pool_and_every_other_set_its_shortfall() -> None:
    model = planner_model("Kimi-K2.5")
    levers = {"tp_size": 8}
    served = with_served(
        model, levers, H200, max_total_num_tokens=116_171, log=LaunchLog(), source="test"
    )
    now = planner.capacity(served, levers, H200, 4000)
    assert now.kv_tokens_per_rank == 116_171
    assert now.kv_tokens_source == "the running server's own sizing"
    assert now.formula_kv_tokens_per_rank == 669_043
    fp8 = {"tp_size": 8, "kv_cache_dtype": "fp8_e4m3"}
    formula = planner.capacity(model, fp8, H200, 4000).kv_tokens_per_rank
    scaled = planner.capacity(served, fp8, H200, 4000)
    assert served.served is not None
    missing = served.served.unseen_bytes_per_rank
    assert scaled.kv_tokens_per_rank == pytest.approx(formula - missing / 35_136, abs=1)
    assert scaled.kv_tokens_source == "formula, scaled by the running server's own sizing"


async def _plan(tmp_path: Path, behaviour: Behaviour) -> dict[str, Any]:
    procs = FakeProcessOps(FakeProbe(8, memory_total_bytes=H200))
    procs.default = behaviour
    levers = {"model_path": KIMI, "tp_size": 8}
    async with api_client(tmp_path, procs=procs, backend_name="sglang", levers=levers) as (
        client,
        rig,
        _,
    ):
        r = await client.post("/plan", json={"avg_tokens": 4000, "host_ram_gib": 408})
        assert r.status_code == 200, r.text
        plan: dict[str, Any] = r.json()
        await rig.sup.shutdown()
        return plan


def test_post_plan_starts_from_the_servers_own_pool_and_says_so(tmp_path: Path) -> None:
    plan = run(lambda: _plan(tmp_path, Behaviour(max_total_num_tokens=116_171, log_lines=LOG)))
    current, served = plan["current"], plan["model"]["served"]
    assert current["kv_tokens_per_rank"] == 116_171
    assert current["kv_tokens_source"] == "the running server's own sizing"
    assert current["mem_fraction_source"] == "the running server"
    assert served["max_total_num_tokens"] == 116_171
    assert served["weight_bytes_per_rank"] == int(83.27 * (1 << 30))
    assert served["formula_kv_tokens_per_rank"] > 5 * 116_171
    # The proposal is sized from the same shortfall: nowhere near the formula's 2×.
    assert plan["proposed"]["kv_tokens_source"].startswith("formula, scaled")
    assert plan["proposed"]["kv_tokens_per_rank"] < served["formula_kv_tokens_per_rank"]
    note = plan["notes"][0]
    assert note.startswith("The running server sized its own KV pool at 116,171 tokens")
    assert "mem_fraction_static 0.806026" in note and "83.3 GiB of weights" in note


def test_a_server_that_agrees_with_the_formula_gets_no_note(tmp_path: Path) -> None:
    model = planner.load_model_dir(Path(KIMI))
    tokens = planner.pools(model, {"model_path": KIMI, "tp_size": 8}, H200).kv_tokens
    plan = run(lambda: _plan(tmp_path, Behaviour(max_total_num_tokens=tokens)))
    assert plan["current"]["kv_tokens_per_rank"] == tokens
    assert not [n for n in plan["notes"] if n.startswith("The running server sized")]
