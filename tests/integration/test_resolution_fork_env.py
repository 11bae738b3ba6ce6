"""A warm resolution helper answers for another lever environment in a fork that takes
it on, where SGLang reads those variables when it runs; a variable read at import starts
a fresh helper (``sglang_supervisor.sglang.resolution_helper.FORK_ENV_PREFIXES``,
docs/validation.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sglang_supervisor.sglang.resolution import GpuFacts, Resolver, Verdict
from tests.integration.sglang_corpus import LLAMA_8B
from tests.sglang_env import ENV, SGLANG_PYTHON, needs_sglang

pytestmark = needs_sglang()

H200 = GpuFacts.simulated(8, 143771)

#: A plugin (loaded by ``load_plugins()`` as ``launch_server`` does) that refuses with
#: what the resolution sees in its environment.
WITNESS = """
import os

def register():
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    @register_resolution_hook("handle_ssl_validation")
    def witness(server_args, previous):
        raise ValueError("witness " + repr({
            "mark": os.environ.get("SGLANG_WITNESS_MARK"),
            "cache": os.environ.get("SGLANG_CACHE_DIR"),
        }))
"""


def _site(tmp: Path) -> Path:
    site = tmp / "site"
    (site / "witness-0.1.dist-info").mkdir(parents=True)
    (site / "witness_plugin.py").write_text(WITNESS)
    (site / "witness-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: witness\nVersion: 0.1\n"
    )
    (site / "witness-0.1.dist-info" / "entry_points.txt").write_text(
        "[sglang.srt.plugins]\nwitness = witness_plugin:register\n"
    )
    return site


def _seen(v: Verdict) -> dict[str, Any]:
    assert not v.ok and (v.message or "").startswith("witness "), v
    seen: dict[str, Any] = eval((v.message or "")[len("witness ") :])  # a repr of plain values
    return seen


def test_a_new_sglang_env_is_answered_by_the_warm_helper_with_that_env(tmp_path: Path) -> None:
    resolver = Resolver(max_helpers=3)
    base = {**ENV, "PYTHONPATH": str(_site(tmp_path))}
    base.pop("SGLANG_WITNESS_MARK", None)
    argv = ["--model-path", LLAMA_8B]
    try:
        v = resolver.resolve(SGLANG_PYTHON, argv, {**base, "SGLANG_WITNESS_MARK": "a"}, H200)
        assert _seen(v)["mark"] == "a"
        assert resolver.helpers_started == 1
        # Another value of a variable SGLang reads when it runs: the same helper, its fork
        # with the new value, and fast (no import).
        t0 = time.monotonic()
        v = resolver.resolve(SGLANG_PYTHON, argv, {**base, "SGLANG_WITNESS_MARK": "b"}, H200)
        took = time.monotonic() - t0
        assert _seen(v)["mark"] == "b"
        assert resolver.helpers_started == 1, "a fork could have answered"
        # The legacy spelling is rewritten in the fork, as SGLang's import would.
        v = resolver.resolve(SGLANG_PYTHON, argv, {**base, "SGL_WITNESS_MARK": "legacy"}, H200)
        assert _seen(v)["mark"] == "legacy"
        assert resolver.helpers_started == 1
        # SGLANG_CACHE_DIR is read while SGLang imports (environ.py's cache redirect):
        # a fresh helper, never a fork that would answer with the old value baked in.
        v = resolver.resolve(SGLANG_PYTHON, argv, {**base, "SGLANG_CACHE_DIR": str(tmp_path)}, H200)
        assert _seen(v)["cache"] == str(tmp_path)
        assert resolver.helpers_started == 2
    finally:
        resolver.close()
    print(f"fork with a new env answered in {took:.2f} s")
