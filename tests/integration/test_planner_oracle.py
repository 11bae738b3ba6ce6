"""The planner's copy of SGLang's rules against SGLang 0.5.23 itself: each case of
tests/planner_cases.py resolved by SGLang's own pipeline (``sglang_supervisor.sglang.resolution``,
in the parser environment built by scripts/sglang-parser-env.sh, an H200 supplied).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_supervisor import planner
from sglang_supervisor.sglang.levers import LeverSet, check_levers, render_argv
from sglang_supervisor.sglang.resolution import GpuFacts, Resolver
from sglang_supervisor.sglang.schema import load_bundled
from tests.helpers import Daemon
from tests.planner_cases import CASES, H200, MODELS, Case, planner_model
from tests.sglang_env import ENV, SGLANG_PYTHON, needs_sglang, resolver

pytestmark = needs_sglang()
__all__ = ["resolver"]  # the fixture

SCHEMA = load_bundled()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    dirs = {}
    for name, config in MODELS.items():
        d = root / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(config))
        dirs[name] = d
    return dirs


#: The daemon's own resolution path for every case of docs/planner.md's first table; of
#: issue 26's models (each also resolved by tests/integration/test_planner_pools_sglang.py)
#: the vision tower's cut and a DSA model, to keep CI's time.
RESOLVED = [
    c for c in CASES if c.before is None or c.name in ("Kimi-K2.5 TP8", "DeepSeek-V3.2 TP8 fp8 KV")
]


@pytest.mark.parametrize("case", RESOLVED, ids=lambda c: c.name)
def test_sglang_resolves_the_fraction_the_planner_predicts(
    resolver: Resolver, model_dirs: dict[str, Path], case: Case
) -> None:
    levers = {"model_path": str(model_dirs[case.model]), **case.levers}
    argv = render_argv(check_levers(LeverSet(levers), SCHEMA, complete=True), SCHEMA)
    verdict = resolver.resolve(SGLANG_PYTHON, argv, ENV, GpuFacts.simulated(8, 143771))
    assert verdict.ok, verdict
    resolved = verdict.resolved.get("mem_fraction_static")
    if resolved is None:
        pytest.skip(f"SGLang's resolution did not size memory here: {verdict.not_run}")
    cap = planner.capacity(planner_model(case.model), case.levers, H200, 4096)
    assert resolved == case.fraction == cap.mem_fraction_static
    for key in ("chunked_prefill_size", "max_running_requests"):
        if key in case.extra:
            assert verdict.resolved[key] == case.extra[key], key


def test_post_plan_takes_sglangs_own_defaults_and_checks_its_proposal(
    tmp_path: Path, model_dirs: dict[str, Path]
) -> None:
    """Where the server's interpreter has SGLang, /plan's current fraction is SGLang's
    resolved one, and the proposal (attention DP for DeepSeek-V3) passed SGLang's own
    resolution before it is shown."""
    d = Daemon(
        tmp_path,
        gpus=8,
        levers={"model_path": str(model_dirs["DeepSeek-V3"]), "tp_size": 8},
        extra={"server": {"python": SGLANG_PYTHON}},
        sim={"host_ram_gib": 512},
    )
    d.start()
    try:
        # A target of requests at once: the capacity levers are proposed whatever the
        # live load reads when /plan comes (an idle server reads "not saturated").
        r = d.client.post("/plan", json={"avg_tokens": 4096, "target_concurrency": 1024})
        assert r.status_code == 200, r.text
        plan = r.json()
        assert plan["current"]["mem_fraction_source"] == "SGLang's own resolution"
        assert plan["current"]["mem_fraction_static"] == 0.886
        assert plan["levers"]["attn_dp_size"] == 8
        assert not [n for n in plan["notes"] if n.startswith("SGLang refuses")]
    finally:
        assert d.stop() == 0
        d.client.close()


def test_post_plan_for_another_model_asks_sglang_about_that_model(
    tmp_path: Path, model_dirs: dict[str, Path]
) -> None:
    """The daemon serves gpt-oss-120b (SGLang: 0.893 at TP8); a plan for DeepSeek-V3's
    directory quotes SGLang's resolution *of DeepSeek-V3* (0.886, memory_hook.py:309-313,
    368, 389), and an inline config.json (no directory SGLang could read) is labelled the
    planner's copy of the rule, never "SGLang's own resolution" of the running model."""
    d = Daemon(
        tmp_path,
        gpus=8,
        levers={"model_path": str(model_dirs["gpt-oss-120b"]), "tp_size": 8},
        extra={"server": {"python": SGLANG_PYTHON}},
        sim={"host_ram_gib": 512},
    )
    d.start()
    try:
        r = d.client.post("/plan", json={"model": str(model_dirs["DeepSeek-V3"])})
        assert r.status_code == 200, r.text
        current = r.json()["current"]
        assert current["mem_fraction_source"] == "SGLang's own resolution"
        assert current["mem_fraction_static"] == 0.886
        r = d.client.post("/plan", json={"config_json": MODELS["DeepSeek-V3"]})
        assert r.status_code == 200, r.text
        current = r.json()["current"]
        assert current["mem_fraction_source"] == "SGLang default"
        assert current["mem_fraction_static"] == 0.886
    finally:
        assert d.stop() == 0
        d.client.close()


def test_kimi_k25_proposal_stays_within_sglangs_own_default_for_the_proposed_set(
    resolver: Resolver, model_dirs: dict[str, Path]
) -> None:
    """The founding incident's model: the proposed fraction is never above what SGLang
    itself picks for exactly the proposed set — its vision tower's cut included
    (memory_hook.py:331-336, adjust_mem_fraction_for_vlm): at 79a70ae the planner
    proposed 0.812 for a set SGLang defaults to 0.7396."""
    hw = planner.Hardware(gpus=8, gpu_memory_bytes=H200, host_ram_available_bytes=408 << 30)
    plan = planner.propose(planner_model("Kimi-K2.5"), hw, {"tp_size": 8}, avg_tokens=4000)
    proposed = dict(plan.proposed_levers)
    fraction = proposed.pop("mem_fraction_static")
    levers = {"model_path": str(model_dirs["Kimi-K2.5"]), **proposed}
    argv = render_argv(check_levers(LeverSet(levers), SCHEMA, complete=True), SCHEMA)
    verdict = resolver.resolve(SGLANG_PYTHON, argv, ENV, GpuFacts.simulated(8, 143771))
    assert verdict.ok, verdict
    sglang = verdict.resolved["mem_fraction_static"]
    assert plan.reserve["sglang_default_fraction"] == pytest.approx(sglang, abs=1e-12)
    assert fraction <= sglang < 0.886 * 0.91
