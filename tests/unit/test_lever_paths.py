"""Which levers name a path or a JSON document (``sglang_supervisor.sglang.lever_paths``), derived
from SGLang 0.5.23's flag schema, and the launch-topology limits (``lever_limits``)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from sglang_supervisor.sglang import probe_checks
from sglang_supervisor.sglang.lever_limits import launch_topology_problems
from sglang_supervisor.sglang.lever_paths import (
    EXPLICIT,
    NOT_PATHS,
    PathChecksUnavailable,
    check_where_the_server_runs,
    path_kinds,
)
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


def test_without_sglang_the_daemon_checks_the_paths_where_the_server_runs(tmp_path: Path) -> None:
    """Issue 27 §5: the embedded default has no SGLang to run the probe's checks; the
    daemon runs them itself, against the server's working directory."""
    cwd = tmp_path / "server-cwd"
    (cwd / "tokenizer").mkdir(parents=True)
    fifo = tmp_path / "template.fifo"
    os.mkfifo(fifo)
    kinds = path_kinds(load_bundled())
    fine = {
        "model_path": "sim/llama",  # a hub id: not a path
        "tokenizer_path": "./tokenizer",  # there, in the server's working directory
        "lora_paths": ['{"lora_name": "a", "lora_path": "org/adapter"}'],  # JSON, a hub id
        "dist_init_addr": "127.0.0.1:29500",
        "json_model_override_args": '{"rope_theta": 10000}',
    }
    assert check_where_the_server_runs(fine, kinds, str(cwd)) == []
    bad = {
        **fine,
        "chat_template": str(fifo),
        "model_path": "/dev/zero",
        "speculative_draft_model_path": "~/no-draft-here-ever",
        "model_loader_extra_config": "[1]",
        "dist_init_addr": "192.0.2.1:29500",  # TEST-NET-1: never this host's
    }
    found = {p["lever"]: p["message"] for p in check_where_the_server_runs(bad, kinds, str(cwd))}
    assert set(found) == {
        "chat_template",
        "model_path",
        "speculative_draft_model_path",
        "model_loader_extra_config",
        "dist_init_addr",
    }, found
    assert "is a FIFO (a named pipe)" in found["chat_template"]
    assert "is a character device" in found["model_path"]
    assert "'~/no-draft-here-ever' does not exist" in found["speculative_draft_model_path"]
    assert "must be a JSON object" in found["model_loader_extra_config"]
    assert "192.0.2.1 is not an address of this host" in found["dist_init_addr"]
    # The daemon's own working directory is not the server's.
    moved = check_where_the_server_runs(fine, kinds, str(tmp_path))
    assert [p["lever"] for p in moved] == ["tokenizer_path"]
    assert f"relative to the server's working directory {tmp_path}" in moved[0]["message"]


def test_a_check_blocked_on_a_hung_mount_is_bounded_and_leaves_one_thread_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stat on a hung NFS/FUSE mount never returns: the check is refused after its
    bound, the next one too while the first is still blocked (never a second thread),
    and checks run again once it returns."""
    hung = threading.Event()
    real = probe_checks.check_paths

    def stat_on_a_hung_mount(*args: object, **kw: object) -> object:
        hung.wait(10)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(probe_checks, "check_paths", stat_on_a_hung_mount)
    kinds = {"tokenizer_path": "local_or_hub"}
    levers = {"tokenizer_path": "/mnt/hung/tokenizer"}
    with pytest.raises(PathChecksUnavailable, match=r"not checked within 0\.2s"):
        check_where_the_server_runs(levers, kinds, None, timeout_s=0.2)
    with pytest.raises(PathChecksUnavailable, match=r"an earlier check .* is still blocked"):
        check_where_the_server_runs(levers, kinds, None, timeout_s=0.2)
    assert sum(t.name == "lever-path-checks" for t in threading.enumerate()) == 1
    hung.set()
    monkeypatch.setattr(probe_checks, "check_paths", real)
    (problem,) = check_where_the_server_runs(levers, kinds, None, timeout_s=5)
    assert "'/mnt/hung/tokenizer' does not exist" in problem["message"]
