"""Values that can never start are refused before anything stops (issue 11, section 2),
and the server's environment refuses variables that load code (section 4's allowlist)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from sglang_supervisor.sglang import lever_limits
from sglang_supervisor.sglang.levers import (
    LeverError,
    LeverSet,
    check_gpu_placement,
    check_levers,
    render_argv,
)
from sglang_supervisor.sglang.schema import load_bundled

SCHEMA = load_bundled()
BASE = {"model_path": "/models/llama", "tp_size": 4}


def refused(levers: dict[str, Any], env: dict[str, Any] | None = None, **kw: Any) -> Any:
    with pytest.raises(LeverError) as info:
        check_levers(LeverSet(levers, env or {}), SCHEMA, **kw)
    problems = info.value.problems
    # Whatever was sent, the answer can be sent back as UTF-8 JSON (no 500).
    json.dumps([p.to_json() for p in problems], ensure_ascii=False).encode("utf-8")
    return problems


@pytest.mark.parametrize(
    ("levers", "env", "lever"),
    [
        ({**BASE, "served_model_name": "llama\ud800"}, {}, "served_model_name"),
        ({**BASE, "uvicorn_access_log_exclude_prefixes": ["/a", "\udfff"]}, {}, None),
        (BASE, {"NCCL_DEBUG": "INFO\ud800"}, "env.NCCL_DEBUG"),
        (BASE, {"NCCL_\ud800": "1"}, None),
        ({**BASE, "served_model_\ud800": "x"}, {}, None),
    ],
)
def test_a_lone_surrogate_is_refused_and_the_answer_is_still_json(
    levers: dict[str, Any], env: dict[str, Any], lever: str | None
) -> None:
    (p,) = refused(levers, env)
    if lever is not None:
        assert p.lever == lever
    p.lever.encode("utf-8")  # echoed safely
    assert "surrogate" in p.message or "not a valid environment variable" in p.message


def test_an_oversized_value_is_refused_with_the_bound() -> None:
    (p,) = refused({**BASE, "served_model_name": "x" * 200_000})
    assert p.lever == "served_model_name"
    assert "200000 bytes" in p.message and str(lever_limits.MAX_VALUE_BYTES) in p.message


def test_an_argv_over_the_total_bound_is_refused() -> None:
    items = ["/p" + "x" * 15_000 + str(i) for i in range(20)]  # each under the value bound
    (p,) = refused({**BASE, "uvicorn_access_log_exclude_prefixes": items})
    assert p.lever == "levers" and str(lever_limits.MAX_LAUNCH_BYTES) in p.message


def test_too_many_list_items_are_refused() -> None:
    (p,) = refused({**BASE, "gc_threshold": [1] * (lever_limits.MAX_LIST_ITEMS + 1)})
    assert p.lever == "gc_threshold" and "at most" in p.message


@pytest.mark.parametrize(
    ("lever", "value", "says"),
    [
        ("tp_size", -8, "must be ≥ 1"),
        ("mem_fraction_static", 5, "must be > 0 and ≤ 1"),
        ("mem_fraction_static", 0, "must be > 0"),
        ("page_size", 0, "≥ 1"),
        ("max_running_requests", 0, "≥ 1"),
        ("base_gpu_id", -1, "non-negative"),
        ("gpu_id_step", 0, "positive"),
    ],
)
def test_values_sglang_cannot_start_with_are_refused(lever: str, value: Any, says: str) -> None:
    (p,) = refused({**BASE, lever: value})
    assert p.lever == lever and says in p.message


def test_a_whole_set_without_model_path_is_refused() -> None:
    (p,) = refused({"tp_size": 4}, complete=True)
    assert p.lever == "model_path" and "required" in p.message
    check_levers(LeverSet({"tp_size": 4}), SCHEMA)  # a partial set (a request) is fine


@pytest.mark.parametrize(
    ("levers", "managed", "lever"),
    [
        ({"tp_size": 4, "base_gpu_id": 6}, 8, "base_gpu_id"),
        ({"tp_size": 8, "gpu_id_step": 2}, 8, "gpu_id_step"),
        ({"tp_size": 2, "base_gpu_id": 2}, 2, "base_gpu_id"),
    ],
)
def test_gpu_ids_outside_the_managed_gpus_are_refused(
    levers: dict[str, Any], managed: int, lever: str
) -> None:
    with pytest.raises(LeverError) as info:
        check_gpu_placement(LeverSet(levers), managed)
    (p,) = info.value.problems
    assert p.lever == lever and f"outside the {managed} managed GPUs" in p.message


@pytest.mark.parametrize(
    "levers",
    [{"tp_size": 4, "base_gpu_id": 4}, {"tp_size": 4, "gpu_id_step": 2}, {"tp_size": 8}],
)
def test_gpu_ids_within_the_managed_gpus_pass(levers: dict[str, Any]) -> None:
    check_gpu_placement(LeverSet(levers), 8)


def test_a_list_item_argparse_reads_as_a_flag_is_refused() -> None:
    (p,) = refused({**BASE, "uvicorn_access_log_exclude_prefixes": ["-1e-05"]})
    assert "read it as a flag" in p.message


def test_a_negative_float_list_item_reaches_argparse_as_the_same_number() -> None:
    levers = check_levers(LeverSet({"bucket_time_to_first_token": [-1e-05, 0.5]}), SCHEMA)
    argv = render_argv(levers, SCHEMA)
    parser = argparse.ArgumentParser()
    parser.add_argument("--bucket-time-to-first-token", type=float, nargs="+")
    assert parser.parse_args(argv).bucket_time_to_first_token == [-1e-05, 0.5]


@pytest.mark.parametrize(
    "name",
    [
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
        "PYTHONPATH",
        "PATH",
        "CUDA_INJECTION64_PATH",
        "NCCL_NET_PLUGIN",
        "NCCL_TUNER_PLUGIN",
        "NCCL_PROFILER_PLUGIN",
        "NCCL_ENV_PLUGIN",
        "NCCL_CONF_FILE",
        "NVSHMEM_BOOTSTRAP_PLUGIN",
        "TORCH_EXTENSIONS_DIR",
        "TRITON_CACHE_DIR",
        "TRITON_PTXAS_PATH",
        "TRITON_OVERRIDE_DIR",
        "UCX_MODULE_DIR",
        "HF_MODULES_CACHE",
        "CUDA_CACHE_PATH",
        "PYTORCH_KERNEL_CACHE_PATH",
        "CUDA_VISIBLE_DEVICES",
        "HOME",
        "MALLOC_CONF",
        # Issue 27 §5: a toolkit the JIT runs, a package SGLang imports, a file written.
        "CUDA_HOME",
        "CUDA_PATH",
        "PYTORCH_NVCC",
        "SGLANG_EXTERNAL_MODEL_PACKAGE",
        "SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE",
        "SGLANG_HTTP_SERVER_APP_PATH",
        "SGLANG_NCCL_SO_PATH",
        "SGLANG_DG_CACHE_DIR",
        "NCCL_DEBUG_FILE",
        "NCCL_TOPO_DUMP_FILE",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
        "CUDA_COREDUMP_FILE",
        "SGLANG_TORCH_PROFILER_DIR",
        "SGLANG_CUDA_COREDUMP_DIR",
        "SGLANG_SUPERVISOR_API__TOKEN",
        "SGLANG_SUPERVISOR_STATE_DIR",
    ],
)
def test_env_that_loads_code_or_is_not_ours_to_set_is_refused(name: str) -> None:
    (p,) = refused(BASE, {name: "/tmp/x"})
    assert p.lever == f"env.{name}"


@pytest.mark.parametrize(
    "name",
    [
        "NCCL_DEBUG",
        "NCCL_IB_HCA",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "HF_TOKEN",
        "HF_HOME",
        "HF_HUB_OFFLINE",
        "TRITON_PRINT_AUTOTUNING",
        "UCX_TLS",
        "TOKENIZERS_PARALLELISM",
        "SGLANG_ENABLE_JIT_DEEPGEMM",
        "SGL_FORCE_SHUTDOWN",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "PYTORCH_CUDA_ALLOC_CONF",
        "CUDA_LAUNCH_BLOCKING",
        "NVSHMEM_DISABLE_P2P",
    ],
)
def test_routine_env_is_accepted(name: str) -> None:
    got = check_levers(LeverSet(BASE, {name: "1"}), SCHEMA)
    assert got.env == {name: "1"}


@pytest.mark.parametrize(
    ("levers", "lever", "text"),
    [
        ({"nccl_port": 10**12}, "nccl_port", "is not a TCP port: must be 0-65535"),
        ({"nccl_port": -1}, "nccl_port", "is not a TCP port"),
        ({"disaggregation_bootstrap_port": 65536}, "disaggregation_bootstrap_port", "0-65535"),
        ({"tokenizer_worker_num": 10**12}, "tokenizer_worker_num", "≤ 1024"),
        ({"tokenizer_worker_num": 0}, "tokenizer_worker_num", "≥ 1"),
        ({"detokenizer_worker_num": 2000}, "detokenizer_worker_num", "≤ 1024"),
        ({"dist_init_addr": "1.2.3.4:70000"}, "dist_init_addr", "has port 70000"),
        ({"dist_init_addr": "1.2.3.4"}, "dist_init_addr", "is not host:port"),
        ({"dist_init_addr": "::1:5000"}, "dist_init_addr", "in brackets"),
        ({"dist_init_addr": "[::1]5000"}, "dist_init_addr", "is not host:port"),
        ({"dist_init_addr": "host:five"}, "dist_init_addr", "no port number"),
        ({"ssl_certfile": "/c.pem", "ssl_keyfile": "/k.pem"}, "ssl_certfile", "HTTPS only"),
        ({"ssl_keyfile": "/k.pem"}, "ssl_keyfile", "HTTPS only"),
        ({"grpc_mode": True}, "grpc_mode", "gRPC instead of HTTP"),
        ({"smg_grpc_mode": True}, "smg_grpc_mode", "gRPC instead of HTTP"),
    ],
)
def test_a_value_that_can_never_serve_is_refused(
    levers: dict[str, Any], lever: str, text: str
) -> None:
    """Issue 27 §5: SGLang checks these only when it binds, or not at all; here they are
    refused by the schema check, whichever SGLang answers after it."""
    (p,) = refused({**BASE, **levers})
    assert p.lever == lever and text in p.message, p


def test_ports_addresses_and_protocols_that_can_serve_pass() -> None:
    levers = {
        **BASE,
        "nccl_port": 0,  # SGLang's range is 0-65535
        "disaggregation_bootstrap_port": 65535,
        "tokenizer_worker_num": 8,
        "dist_init_addr": "[::1]:5000",
        "ssl_ca_certs": "/etc/ssl/ca.pem",  # alone: no TLS (SGLang refuses it, not us)
        "grpc_port": 30001,  # SGLang's native gRPC beside HTTP
        "grpc_mode": False,
    }
    assert check_levers(LeverSet(levers), SCHEMA).levers["dist_init_addr"] == "[::1]:5000"
