"""SGLang 0.5.23's own launch-time resolution, run in the server's interpreter
(``.venv-sglang``, built by ``scripts/sglang-parser-env.sh``) with the managed GPUs' facts.

The corpus (``sglang_corpus.py``) cites, per bad set, the SGLang file:line that refuses
it; the tests check SGLang raised exactly there. One test drives a running
``serve --simulate`` daemon through the whole corpus and checks the server's pid never
changes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_supervisor.sglang.levers import LeverSet, check_levers, render_argv
from sglang_supervisor.sglang.resolution import GpuFacts, Resolver, Verdict
from sglang_supervisor.sglang.schema import load_bundled
from tests.helpers import Daemon
from tests.integration.sglang_corpus import (
    BAD,
    CAUGHT_BY_LIMITS,
    GOOD,
    LLAMA_8B,
    MODELS,
    Bad,
    Good,
)
from tests.sglang_env import ENV, SGLANG_PYTHON, needs_sglang, resolver

pytestmark = needs_sglang()
__all__ = ["resolver"]  # the fixture

SCHEMA = load_bundled()
H200 = GpuFacts.simulated(8, 143771)


def argv_of(levers: dict[str, Any], *, checked: bool = True) -> list[str]:
    """The argv the daemon renders for ``levers`` (``checked=False``: bypassing the
    supervisor's own limits, to ask SGLang about values those would refuse first)."""
    if checked:
        return render_argv(check_levers(LeverSet(levers), SCHEMA, complete=True), SCHEMA)
    return [f"{SCHEMA.flags[k].option}={v}" for k, v in levers.items()]


def resolve(resolver: Resolver, levers: dict[str, Any], **kw: Any) -> Verdict:
    gpu = kw.pop("gpu", H200)
    env = kw.pop("env", ENV)
    argv = kw.pop("argv", None) or argv_of(levers)
    return resolver.resolve(SGLANG_PYTHON, argv, env, gpu, **kw)


@pytest.mark.parametrize("case", BAD, ids=[b.name for b in BAD])
def test_bad_set_is_refused_where_sglang_refuses_it(resolver: Resolver, case: Bad) -> None:
    argv = argv_of(case.levers, checked=case.name not in CAUGHT_BY_LIMITS)
    v = resolve(resolver, case.levers, argv=argv)
    assert not v.ok, f"SGLang accepted {case.levers}: {v}"
    assert v.where == case.where, v
    assert case.says in (v.message or ""), v.message
    assert v.sglang_version == "0.5.23"


def test_the_corpus_is_big_enough() -> None:
    assert len(BAD) >= 25
    assert len({b.where for b in BAD}) >= 25, "25 distinct SGLang refusals"


@pytest.mark.parametrize("case", GOOD, ids=[g.name for g in GOOD])
def test_good_production_set_is_accepted_with_what_sglang_resolved(
    resolver: Resolver, case: Good
) -> None:
    v = resolve(resolver, case.levers)
    assert v.ok, v
    for name, expected in case.resolved.items():
        assert v.resolved.get(name) == expected, (name, v.resolved)
    # Only start-up's own facts are reported as not run.
    assert [n for n in v.not_run if not n["check"].startswith("start-up only")] == []


def test_hardware_facts_come_from_the_managed_gpus(resolver: Resolver) -> None:
    # memory_hook.py:132-145: an 80 GB H100 with tp < 4 gets decode graphs up to 256;
    # :160-170: a B200 (> 160 GiB) gets chunk 16384 and 512.
    h100 = GpuFacts(8, "NVIDIA H100 80GB HBM3", (9, 0), 81559)
    b200 = GpuFacts(8, "NVIDIA B200", (10, 0), 183359)
    v = resolve(resolver, {"model_path": LLAMA_8B}, gpu=h100)
    assert (v.resolved["chunked_prefill_size"], v.resolved["cuda_graph_max_bs"]) == (8192, 256)
    v = resolve(resolver, {"model_path": LLAMA_8B}, gpu=b200)
    assert (v.resolved["chunked_prefill_size"], v.resolved["cuda_graph_max_bs"]) == (16384, 512)
    # Blackwell-only KV dtypes: refused on Hopper (the corpus), accepted on SM 10.0.
    assert resolve(resolver, {"model_path": LLAMA_8B, "kv_cache_dtype": "nvfp4"}, gpu=b200).ok


def test_a_model_that_is_not_local_says_what_did_not_run(resolver: Resolver) -> None:
    hub = {"model_path": "meta-llama/Llama-3.1-8B-Instruct", "tp_size": 8}
    v = resolve(resolver, hub)
    assert v.ok and v.resolved == {}
    assert any(
        "needs the model config" in n["reason"] and "never downloads" in n["reason"]
        for n in v.not_run
    )
    # The model-independent checks still ran (with stand-in configs).
    bad = {**hub, "enable_hierarchical_cache": True, "hicache_host_memory_fraction": 1.5}
    v = resolve(resolver, bad)
    assert not v.ok and "hicache_hook.py:117" in (v.where or "")


def test_a_rule_only_some_model_families_keep_is_not_run_for_a_hub_id(
    resolver: Resolver,
) -> None:
    """Kimi-K2.5 is MLA: SGLang accepts a hierarchical cache with dcp_size 2 for it
    (kv_cache_hook's "only supported for MLA models"). Without its config (a hub id not
    cached), the dense stand-ins refuse it and the MLA MoE stand-in does not: the rule
    depends on the model, so it is reported as not run, never as a refusal."""
    levers = {"tp_size": 8, "dcp_size": 2, "enable_hierarchical_cache": True}
    local = resolve(resolver, {"model_path": str(MODELS / "kimi-k2.5"), **levers})
    assert local.ok, local
    hub = resolve(resolver, {"model_path": "moonshotai/Kimi-K2.5", **levers})
    assert hub.ok, hub
    (item,) = [n for n in hub.not_run if "only supported for MLA models" in n["reason"]]
    assert "not under DeepseekV3ForCausalLM" in item["reason"], item


WITNESS = """
import os, sys

def register():
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    @register_resolution_hook("handle_ssl_validation")
    def witness(server_args, previous):
        shadow = [p for p in sys.path if p.rstrip("/").endswith("/supervisor")]
        raise ValueError("witness " + repr({
            "cwd": os.getcwd(), "path0": sys.path[0], "shadow": shadow,
            "mark": os.environ.get("WITNESS_MARK"),
        }))
"""


def test_the_probe_runs_in_the_servers_environment_and_directory(
    resolver: Resolver, tmp_path: Path
) -> None:
    """An SGLang plugin reachable only through the server's PYTHONPATH is loaded (as
    ``launch_server`` loads plugins) and sees the server's cwd and env; the probe's own
    directory is not on sys.path."""
    site = tmp_path / "site"
    (site / "witness-0.1.dist-info").mkdir(parents=True)
    (site / "witness_plugin.py").write_text(WITNESS)
    (site / "witness-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: witness\nVersion: 0.1\n"
    )
    (site / "witness-0.1.dist-info" / "entry_points.txt").write_text(
        "[sglang.srt.plugins]\nwitness = witness_plugin:register\n"
    )
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    env = {**ENV, "PYTHONPATH": str(site), "WITNESS_MARK": "lever-env"}
    v = resolve(resolver, {"model_path": LLAMA_8B}, env=env, cwd=str(workdir))
    assert not v.ok and (v.message or "").startswith("witness "), v
    seen = eval((v.message or "")[len("witness ") :])  # a repr of plain values
    assert seen["cwd"] == str(workdir) and seen["mark"] == "lever-env"
    assert seen["path0"] in ("", str(workdir)) and seen["shadow"] == []
    # Without the server's PYTHONPATH the plugin is not there.
    assert resolve(resolver, {"model_path": LLAMA_8B}).ok


MISSING = """
def register():
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    @register_resolution_hook("handle_ssl_validation")
    def needs_a_kernel(server_args, previous):
        import sgs_kernel_not_installed  # noqa: F401
"""


def test_what_this_host_lacks_is_not_run_never_a_refusal(
    resolver: Resolver, tmp_path: Path
) -> None:
    """A module missing here (a kernel package of a GPU host) stops the resolution: the
    verdict says what did not run and why, and does not refuse the levers."""
    (tmp_path / "missing-0.1.dist-info").mkdir()
    (tmp_path / "missing_plugin.py").write_text(MISSING)
    (tmp_path / "missing-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: missing\nVersion: 0.1\n"
    )
    (tmp_path / "missing-0.1.dist-info" / "entry_points.txt").write_text(
        "[sglang.srt.plugins]\nmissing = missing_plugin:register\n"
    )
    env = {**ENV, "PYTHONPATH": str(tmp_path)}
    v = resolve(resolver, {"model_path": LLAMA_8B}, env=env)
    assert v.ok and v.resolved == {}
    assert any("needs the module 'sgs_kernel_not_installed'" in n["reason"] for n in v.not_run), v


# ---------------------------------------------------------------- through the daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(
        tmp_path_factory.mktemp("sglres"),
        gpus=8,
        levers={"model_path": LLAMA_8B, "tp_size": 8, "mem_fraction_static": 0.85},
        extra={"server": {"python": SGLANG_PYTHON}},
        sim={"host_ram_gib": 512},
    )
    d.start()
    yield d
    assert d.stop() == 0
    d.client.close()


def test_every_bad_set_is_refused_with_the_server_untouched(daemon: Daemon) -> None:
    pid = daemon.status()["server"]["pid"]
    for case in BAD:
        r = daemon.apply(case.levers, replace=True)
        assert r.status_code == 422, (case.name, r.text)
        problems = r.json()["detail"]["problems"]
        text = json.dumps(problems)
        if case.name in CAUGHT_BY_LIMITS:
            assert problems[0]["lever"] == case.lever, (case.name, problems)
        else:
            (p,) = problems
            assert p["lever"] == case.lever, (case.name, p)
            assert "SGLang 0.5.23" in text and case.where in text, (case.name, p)
        s = daemon.status()
        assert s["server"]["pid"] == pid and s["state"] == "ready", case.name


def test_a_good_set_shows_what_sglang_resolved(daemon: Daemon) -> None:
    levers = {"model_path": LLAMA_8B, "tp_size": 8, "chunked_prefill_size": 4096}
    r = daemon.apply(levers, replace=True, dry_run=True)
    assert r.status_code == 200, r.text
    op = r.json()["operation"]
    assert op["resolved"]["chunked_prefill_size"] == 4096
    assert op["resolved"]["cuda_graph_max_bs"] == 512
    validate = op["phases"][0]
    assert validate["name"] == "validate"
    assert "resolved mem_fraction_static" in validate["detail"]
    assert "max_running_requests decided at start-up" in validate["detail"]
    # A real apply: the operation in /status carries the same resolved values.
    r = daemon.apply(levers, replace=True)
    assert r.status_code == 200 and r.json()["operation"]["state"] == "succeeded", r.text
    last = daemon.status()["last_operation"]
    assert last["resolved"]["chunked_prefill_size"] == 4096, last
