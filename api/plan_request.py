"""What ``POST /plan`` asks (``PlanRequest``: every field optional, unset ones come from the
running daemon) and the model it names (``resolve_model``: a directory, an inline
config.json, the backend's own model, or a snapshot in the Hugging Face cache)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sglang_supervisor import planner
from sglang_supervisor.host.backend import Backend
from sglang_supervisor.planner import ModelSpec, PlanError


class PlanRequest(BaseModel):
    """``POST /plan``: every field optional; unset ones come from the running daemon."""

    model_config = ConfigDict(extra="forbid")

    #: A local model directory *on the daemon's host* (config.json, safetensors).
    model: str | None = None
    #: An inline config.json (instead of ``model``).
    config_json: dict[str, Any] | None = None
    #: With ``config_json``: the weights' total bytes, when known (else estimated).
    weight_bytes: int | None = Field(None, gt=0)
    #: With ``config_json``: how ``weight_bytes`` was found, and the model's name.
    weight_source: str | None = None
    name: str | None = None
    gpus: int | None = Field(None, ge=1, le=4096)
    gpu_memory_gib: float | None = Field(None, gt=0, le=100_000)
    host_ram_gib: float | None = Field(None, gt=0, le=1_000_000)
    avg_tokens: int | None = Field(None, ge=1, le=100_000_000)
    target_concurrency: int | None = Field(None, ge=1, le=10_000_000)


def hf_cached_model_dir(repo_id: str) -> Path | None:
    """The newest snapshot of ``repo_id`` in the Hugging Face cache that has a config.json."""
    if repo_id.count("/") != 1:
        return None
    home = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub"
    )
    snapshots = Path(home) / f"models--{repo_id.replace('/', '--')}" / "snapshots"
    try:
        found = [d for d in snapshots.iterdir() if (d / "config.json").is_file()]
    except OSError:
        return None
    return max(found, key=lambda d: d.stat().st_mtime) if found else None


def resolve_model(
    body: PlanRequest, *, model_path: str, backend: Backend, env: dict[str, str]
) -> ModelSpec:
    """The model to plan for (blocking: reads the model directory). ``model_path`` and
    ``env`` are the current levers' (``env`` merged onto the daemon's and the backend's);
    a backend that serves its own model (the simulated one) resolves it.
    ``PlanError`` says why none could be found."""
    if body.model is not None and body.config_json is not None:
        raise PlanError("give either model (a directory) or config_json, not both")
    if body.config_json is not None:
        return planner.model_from_config(
            body.config_json,
            name=body.name or str(body.config_json.get("_name_or_path") or "inline config"),
            source="the config.json in the request",
            weight_bytes=body.weight_bytes,
            weight_source=body.weight_source or ("given" if body.weight_bytes else None),
        )
    if body.model is not None:
        return planner.load_model_dir(Path(body.model).expanduser())
    if backend.plan_model is not None:
        # What the backend's server itself resolves, from the environment it is given.
        return backend.plan_model(model_path, env)
    local = Path(model_path).expanduser()
    if model_path and (local / "config.json").is_file():
        return planner.load_model_dir(local)
    cached = hf_cached_model_dir(model_path) if model_path else None
    if cached is not None:
        return planner.load_model_dir(cached)
    raise PlanError(
        f"the current model_path {model_path!r} is neither a local directory with a "
        "config.json nor in this host's Hugging Face cache; pass model (a local model "
        "directory) or config_json"
    )
