"""Which levers name a path or a JSON document (``sglang_supervisor.sglang.lever_paths``), derived
from SGLang 0.5.23's flag schema, and the launch-topology limits (``lever_limits``)."""

from __future__ import annotations

import pytest

from sglang_supervisor.sglang.lever_limits import launch_topology_problems
from sglang_supervisor.sglang.lever_paths import EXPLICIT, NOT_PATHS, path_kinds
from sglang_supervisor.sglang.parser import read_schema
from sglang_supervisor.sglang.schema import load_bundled
from tests.sglang_env import SGLANG_PYTHON, needs_sglang

#: The levers that name a path SGLang reads, derived from the 0.5.23 schema by name
#: (``*_path``, ``*_file``...) and help text (outputs SGLang writes are left out).
DERIVED_0523 = {
    "debug_tensor_dump_input_file",
    "decrypted_config_file",
    "decrypted_draft_config_file",
    "flexkv_config_file",
    "lmcache_config_file",
    "modelopt_checkpoint_restore_path",
    "pdmux_config_path",
    "speculative_dspark_confidence_sts_path",
    "speculative_dspark_sps_table_path",
    "speculative_ngram_external_corpus_path",
}


def test_derived_from_the_bundled_schema() -> None:
    kinds = path_kinds(load_bundled())
    assert {k for k, v in kinds.items() if v == "exists"} == DERIVED_0523
    for name, kind in EXPLICIT.items():
        assert kinds[name] == kind
    # Outputs SGLang writes and URL paths are never checked for existence.
    for name in ("modelopt_checkpoint_save_path", "modelopt_export_path", "file_storage_path"):
        assert name not in kinds
    assert not NOT_PATHS & set(kinds)


@needs_sglang()[0]
@needs_sglang()[1]
def test_every_listed_name_is_a_flag_of_sglangs_own_parser() -> None:
    live = read_schema(SGLANG_PYTHON)
    assert live.sglang_version == "0.5.23"
    missing = sorted((set(EXPLICIT) | NOT_PATHS) - set(live.flags))
    assert missing == [], f"not flags of SGLang {live.sglang_version}: {missing}"
    assert path_kinds(live) == path_kinds(load_bundled())


@pytest.mark.parametrize(
    ("levers", "lever"),
    [
        ({"nccl_port": 30000}, "nccl_port"),
        ({"disaggregation_bootstrap_port": 8470}, "disaggregation_bootstrap_port"),
        ({"dist_init_addr": "127.0.0.1:30000"}, "dist_init_addr"),
    ],
)
def test_launch_topology_refusals(levers: dict[str, object], lever: str) -> None:
    (problem,) = launch_topology_problems(levers, server_port=30000, api_port=8470)
    assert problem[0] == lever


def test_launch_topology_accepts_other_ports_and_one_node() -> None:
    levers = {"nccl_port": 30001, "dist_init_addr": "10.0.0.1:5000", "nnodes": 1}
    assert launch_topology_problems(levers, server_port=30000, api_port=8470) == []
