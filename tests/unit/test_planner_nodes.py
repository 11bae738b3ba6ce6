"""The planner knows nodes (issue 22): ranks and GPU memory per node, a proposal that
keeps ``tp × pp % nnodes == 0``, ``POST /plan`` counting one node's GPUs under the Slurm
launcher, and the offline ``plan --nnodes``.

SGLang 0.5.23's rules (paths under ``sglang/srt/``): each node runs ``tp × pp / nnodes``
ranks (``entrypoints/engine.py:2062-2076``, ``_calculate_rank_ranges``, run below from
SGLang's own source); ``tp × pp`` not divisible by ``nnodes`` is refused
(``arg_groups/validation_hook.py:178-181``), so are DP replicas across nodes (``:199-202``);
the host pool's auto-sizing shares one host's RAM among that host's ranks
(``mem_cache/pool_host/base.py:68-81``).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import types
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor import planner
from sglang_supervisor.host.gpu import GpuInfo
from sglang_supervisor.planner import Hardware, PlanError, proposal
from sglang_supervisor.planner.nodes import NodeShare, candidate_node_problem
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor_api.plan import PlanRequest, make_plan, node_gpus
from tests.planner_evidence import kv_bound
from tests.sglang_env import SGLANG_PYTHON
from tests.unit.fakes import make_rig, run
from tests.unit.test_cli_plan import plan as cli_plan
from tests.unit.test_planner import DEEPSEEK_V3

MiB = 1 << 20
GiB = 1 << 30
H200 = 143771 * MiB
TP16_2NODES = {"tp_size": 16, "nnodes": 2}


def deepseek() -> planner.ModelSpec:
    return planner.model_from_config(DEEPSEEK_V3, name="DeepSeek-V3", source="test")


def hardware(gpus: int = 8, host_gib: int = 2048) -> Hardware:
    return Hardware(gpus=gpus, gpu_memory_bytes=H200, host_ram_available_bytes=host_gib * GiB)


# --- SGLang's placement -----------------------------------------------------------------


def sglang_rank_ranges() -> Any:
    """SGLang's own ``_calculate_rank_ranges`` (engine.py cannot be imported without the
    GPU stack, so its function is compiled from SGLang's source with ``get_parallel``
    answering the sizes)."""
    venv = Path(SGLANG_PYTHON).parent.parent
    found = sorted(venv.glob("lib/python3*/site-packages/sglang/srt/entrypoints/engine.py"))
    if not found:
        pytest.skip(f"no SGLang sources under {venv}")
    tree = ast.parse(found[0].read_text())
    fn = next(
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name == "_calculate_rank_ranges"
    )
    fn.returns = None  # its annotation names typing.Tuple, not needed to run it
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module([fn], []), str(found[0]), "exec"), namespace)
    return namespace


@pytest.mark.parametrize(
    ("tp", "pp", "nnodes"),
    [(16, 1, 2), (8, 2, 2), (4, 4, 2), (16, 2, 4), (32, 1, 4), (2, 3, 2), (8, 1, 1)],
)
def test_ranks_per_node_are_sglangs(tp: int, pp: int, nnodes: int) -> None:
    namespace = sglang_rank_ranges()
    parallel = types.SimpleNamespace(tp_size=tp, pp_size=pp, nnodes=nnodes)
    namespace["get_parallel"] = lambda: parallel
    per_node, placed = set(), set()
    for node in range(nnodes):
        pp_ranks, tp_ranks, _, _ = namespace["_calculate_rank_ranges"](node)
        per_node.add(len(pp_ranks) * len(tp_ranks))
        placed |= {(p, t) for p in pp_ranks for t in tp_ranks}
    levers = {"tp_size": tp, "pp_size": pp, "nnodes": nnodes}
    share = NodeShare.of(levers)
    assert {share.ranks_per_node} == per_node
    # Where SGLang's placement leaves ranks out (tp 2 × pp 3 over 2 nodes puts 2 of the 6
    # ranks on each), the planner refuses the layout instead of planning half a server.
    covers = len(placed) == tp * pp
    assert (share.problem(levers) is None) == covers


# --- the capacity per rank, per node ------------------------------------------------------


def test_tp16_over_two_nodes_has_the_per_rank_kv_of_tp16_on_one_host() -> None:
    model = deepseek()
    two = planner.capacity(model, TP16_2NODES, H200, 4096)
    one = planner.capacity(model, {"tp_size": 16}, H200, 4096)
    # The cell and the pool are per rank: the node count does not change them.
    assert two.cell_bytes == one.cell_bytes == 70_272  # MLA bf16: (512 + 64) × 61 × 2
    assert two.kv_tokens_per_rank == one.kv_tokens_per_rank > 0
    assert two.weight_bytes_per_rank == one.weight_bytes_per_rank
    assert (two.ranks, two.nnodes, two.ranks_per_node) == (16, 2, 8)
    assert (one.ranks, one.nnodes, one.ranks_per_node) == (16, 1, 16)


def test_plan_for_tp16_on_two_nodes_of_8_h200() -> None:
    plan = planner.propose(deepseek(), hardware(8), TP16_2NODES, avg_tokens=4096)
    new = plan.proposed_levers
    assert new.get("nnodes") == 2  # never proposed beyond the current value
    assert (new["tp_size"] * new.get("pp_size", 1)) % new["nnodes"] == 0
    nodes = plan.to_json()["nodes"]
    assert nodes["nnodes"] == 2
    assert nodes["ranks_per_node"] == 8
    assert nodes["gpus_per_node"] == 8
    assert nodes["gpu_memory_bytes_per_node"] == 8 * H200
    # One host's figures for the same server: the KV per rank is the same.
    host = planner.propose(deepseek(), hardware(16), {"tp_size": 16}, avg_tokens=4096)
    assert plan.current.kv_tokens_per_rank == host.current.kv_tokens_per_rank


def test_host_cache_is_budgeted_over_one_nodes_ranks() -> None:
    # Each node has its own host RAM: 8 ranks share 1 TiB, as tp8 on one host does.
    live = kv_bound()  # shared prefixes lost to eviction: the host cache's evidence
    two = planner.propose(deepseek(), hardware(8, 1024), TP16_2NODES, avg_tokens=4096, live=live)
    one = planner.propose(deepseek(), hardware(8, 1024), {"tp_size": 8}, avg_tokens=4096, live=live)
    assert two.levers["hicache_size"] == one.levers["hicache_size"] > 0
    assert two.proposed.host_ram_needed_bytes_per_node == one.proposed.host_ram_needed_bytes


def test_a_node_short_of_gpus_is_refused_per_node() -> None:
    with pytest.raises(PlanError, match=r"8 ranks on each node.*8 GPUs per node.*has 4 per node"):
        planner.propose(deepseek(), hardware(4), TP16_2NODES, avg_tokens=4096)


@pytest.mark.parametrize(
    ("levers", "match"),
    [
        ({"tp_size": 6, "nnodes": 4}, "= 6 is not divisible by nnodes 4"),
        ({"tp_size": 8, "dp_size": 2, "nnodes": 2}, "dp_size 2 with nnodes 2"),
        ({"tp_size": 2, "pp_size": 3, "nnodes": 2}, "4 of the 6 ranks"),
    ],
)
def test_current_levers_sglang_cannot_place_are_refused(levers: dict[str, Any], match: str) -> None:
    with pytest.raises(PlanError, match=match):
        planner.propose(deepseek(), hardware(8), levers, avg_tokens=4096)


# --- a candidate that breaks the node layout is skipped ----------------------------------


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"tp_size": 15}, "15 is not divisible by nnodes 2"),
        ({"nnodes": 3}, "nnodes 3, more than the 2 node(s)"),
    ],
)
def test_a_candidate_breaking_the_nodes_is_skipped_with_a_note(
    monkeypatch: pytest.MonkeyPatch, change: dict[str, Any], why: str
) -> None:
    # The attention-DP candidate is the one that changes parallel levers: make it break
    # the node layout (it would raise capacity, so only the filter keeps it out).
    original = proposal.attention_dp_candidate

    def broken(model: planner.ModelSpec, levers: Any) -> dict[str, Any] | None:
        candidate = original(model, levers)
        return None if candidate is None else {**candidate, **change}

    monkeypatch.setattr(proposal, "attention_dp_candidate", broken)
    plan = planner.propose(deepseek(), hardware(8), TP16_2NODES, avg_tokens=4096)
    assert "attn_dp_size" not in plan.levers
    assert not set(change) & set(plan.levers)
    assert any("candidate lever set was skipped" in n and why in n for n in plan.notes)
    new = plan.proposed_levers
    assert new["tp_size"] * new.get("pp_size", 1) % new["nnodes"] == 0


def test_candidate_node_problem() -> None:
    assert candidate_node_problem(TP16_2NODES, {**TP16_2NODES, "attn_dp_size": 16}) is None
    assert candidate_node_problem({"tp_size": 8}, {"tp_size": 8, "nnodes": 2}) is not None
    assert candidate_node_problem(TP16_2NODES, {"tp_size": 16, "nnodes": 1}) is None


# --- POST /plan under the Slurm launcher ---------------------------------------------------


def slurm_gpus() -> tuple[GpuInfo, ...]:
    """Two nodes' GPUs as the Slurm probe lists them: numbered node by node, named
    ``<node>/<uuid>`` (sglang_supervisor.slurm.probe)."""
    return tuple(GpuInfo(i, f"n{1 + i // 8}/GPU-{i:04d}", "NVIDIA H200", H200) for i in range(16))


def test_node_gpus_counts_one_node() -> None:
    one, nodes = node_gpus(slurm_gpus())
    assert (len(one), nodes) == (8, 2)
    local = tuple(GpuInfo(i, f"GPU-{i:04d}", "NVIDIA H200", H200) for i in range(8))
    assert node_gpus(local) == (list(local), 1)


def test_post_plan_on_a_slurm_daemon_plans_per_node(tmp_path: Path) -> None:
    rig = make_rig(tmp_path)

    async def main() -> dict[str, Any]:
        await rig.start_ready()
        view = dataclasses.replace(
            rig.sup.view(), managed=slurm_gpus(), levers=LeverSet(dict(TP16_2NODES))
        )
        body = PlanRequest(config_json=DEEPSEEK_V3, name="DeepSeek-V3", host_ram_gib=2048)
        try:
            return await make_plan(body, view, rig.sup.backend)
        finally:
            await rig.sup.shutdown()

    out = run(main)
    assert out["hardware"]["gpus"] == 8
    assert "per node (2 Slurm nodes, 16 in all)" in out["hardware"]["gpu_source"]
    assert out["nodes"]["ranks_per_node"] == 8
    assert out["current"]["kv_tokens_per_rank"] > 0


# --- the CLI ------------------------------------------------------------------------------


def test_offline_plan_with_nnodes(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(DEEPSEEK_V3))
    args = ("--config-json", str(cfg), "--gpus", "8", "--gpu-memory", str(H200 / GiB))
    code, out, err = cli_plan(*args, "--host-ram", "2048", "--nnodes", "2")
    assert code == 0, err
    assert "Nodes      2 nodes × 8 GPUs" in out
    assert "8 of the 16 ranks on each node" in out
    assert "host RAM needed per node" in out
    code, out, err = cli_plan(*args, "--host-ram", "2048", "--nnodes", "2", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["current_levers"] == {"tp_size": 16, "nnodes": 2}
    assert data["nodes"]["ranks_per_node"] == 8
    code, _, err = cli_plan(*args, "--nnodes", "0")
    assert code == 2 and "--nnodes must be positive" in err
    code, _, err = cli_plan("--url", "http://127.0.0.1:9", "--nnodes", "2")
    assert code == 2 and "--nnodes is for offline planning" in err


def test_one_node_plans_say_nothing_of_nodes(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(DEEPSEEK_V3))
    code, out, err = cli_plan(
        "--config-json", str(cfg), "--gpus", "8", "--gpu-memory", "140", "--host-ram", "2048"
    )
    assert code == 0, err
    assert "Nodes " not in out and "per node" not in out
