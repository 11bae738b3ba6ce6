"""Request bodies of the control API (responses are the supervisor's own JSON)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool


class ApplyRequest(BaseModel):
    """``POST /levers``: merged onto the current levers unless ``replace``."""

    model_config = ConfigDict(extra="forbid")

    #: SGLang flag dest-names -> values; ``null`` removes a lever (back to SGLang's default).
    levers: dict[str, Any] = Field(default_factory=dict)
    #: Extra environment of the server (NCCL_*, SGLANG_*, CUDA_*, TORCH_*, PYTORCH_*, NVSHMEM_*).
    env: dict[str, Any] = Field(default_factory=dict)
    # Strict: "yes", 1 or "false" are refused, never read as a (possibly wrong) boolean.
    replace: StrictBool = False
    #: Also ``?dry_run=true``; given in both places, they must agree.
    dry_run: StrictBool = False
    #: Wait up to this long for running and queued requests to finish before stopping.
    drain_timeout_s: float = Field(0.0, ge=0, allow_inf_nan=False)
    #: Restart the server even when the levers are those it already serves (without it,
    #: such an apply succeeds at once and touches nothing).
    force_restart: bool = False
    #: Apply although the [router] does not answer (it is checked before the stop); a
    #: router that then does not take the new server does not roll the apply back.
    without_router: bool = False
    #: The effect guard for this apply (null: ``[server] effect_guard``): the commit waits
    #: for the measured effect and a worse one rolls back to the last-good levers.
    effect_guard: StrictBool | None = None
