"""Issue 27 §5: values that can never serve, each refused before the stop with a 422
naming its lever, with SGLang 0.5.23's whole pipeline behind validation
(``test_refused_paths.py``) and without it, on the embedded default
(``test_refused_up_front.py``). ``{fifo}`` stands for a real FIFO the test makes.

Before (main 79a70ae) every one of them was accepted by both — a dry run ``succeeded`` —
but ``model_path: "/etc"`` and a missing ``tokenizer_path`` with SGLang behind it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: (case, levers, env, the lever named, text its message must contain)
NEVER_SERVE: list[tuple[str, dict[str, Any], dict[str, str], str, str]] = [
    (
        "nccl_port_1e12",
        {"nccl_port": 10**12},
        {},
        "nccl_port",
        "is not a TCP port: must be 0-65535",
    ),
    ("nccl_port_negative", {"nccl_port": -1}, {}, "nccl_port", "is not a TCP port"),
    (
        "tokenizer_worker_num_1e12",
        {"tokenizer_worker_num": 10**12},
        {},
        "tokenizer_worker_num",
        "must be ≥ 1 and ≤ 1024",
    ),
    ("model_path_dev_zero", {"model_path": "/dev/zero"}, {}, "model_path", "is a character device"),
    ("model_path_fifo", {"model_path": "{fifo}"}, {}, "model_path", "is a FIFO (a named pipe)"),
    (
        "chat_template_dev_zero",
        {"chat_template": "/dev/zero"},
        {},
        "chat_template",
        "is a character device",
    ),
    ("chat_template_fifo", {"chat_template": "{fifo}"}, {}, "chat_template", "is a FIFO"),
    (
        "dist_init_addr_elsewhere",
        {"dist_init_addr": "1.2.3.4:5"},
        {},
        "dist_init_addr",
        "1.2.3.4 is not an address of this host",
    ),
    (
        "dist_init_addr_without_port",
        {"dist_init_addr": "127.0.0.1"},
        {},
        "dist_init_addr",
        "is not host:port",
    ),
    (
        "model_loader_extra_config_not_json",
        {"model_loader_extra_config": "{bad"},
        {},
        "model_loader_extra_config",
        "is not valid JSON",
    ),
    (
        "ssl_pair_serves_https",
        {"ssl_certfile": "/etc/passwd", "ssl_keyfile": "/etc/passwd"},
        {},
        "ssl_certfile",
        "answer HTTPS only",
    ),
    ("grpc_mode", {"grpc_mode": True}, {}, "grpc_mode", "answer gRPC instead of HTTP"),
    ("smg_grpc_mode", {"smg_grpc_mode": True}, {}, "smg_grpc_mode", "answer gRPC instead of HTTP"),
    ("model_path_not_a_model", {"model_path": "/etc"}, {}, "model_path", "without a config.json"),
    (
        "tokenizer_path_missing",
        {"tokenizer_path": "/nonexistent/tokenizer"},
        {},
        "tokenizer_path",
        "does not exist",
    ),
    *(
        (f"env_{name}", {}, {name: "/tmp/x"}, f"env.{name}", "from a path")
        for name in ("CUDA_HOME", "CUDA_PATH", "SGLANG_EXTERNAL_MODEL_PACKAGE")
    ),
    *(
        (f"env_{name}", {}, {name: "/etc/x"}, f"env.{name}", "writes to (or reads) the path")
        for name in ("NCCL_DEBUG_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    ),
    (
        "env_daemon_setting",
        {},
        {"SGLANG_SUPERVISOR_API__TOKEN": "x"},
        "env.SGLANG_SUPERVISOR_API__TOKEN",
        "this daemon's own settings",
    ),
]

IDS = [c[0] for c in NEVER_SERVE]


def make_fifo(directory: Path) -> Path:
    """A real FIFO (nothing ever writes to it: a reader would block for ever)."""
    fifo = directory / "never-written.fifo"
    os.mkfifo(fifo)
    return fifo


def with_fifo(levers: dict[str, Any], fifo: Path) -> dict[str, Any]:
    return {k: str(fifo) if v == "{fifo}" else v for k, v in levers.items()}
