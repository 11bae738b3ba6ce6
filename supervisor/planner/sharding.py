"""Layouts SGLang 0.5.23 cannot build for a model, found from its config.json before the
stop (SGLang fails only when it constructs the model, after the running server is gone).

(Paths under ``sglang/srt/``.)

* Attention heads over the attention TP group: ``QKVParallelLinear`` divides the query
  heads by it (``layers/linear.py:1139``, ``divide`` = ``distributed/utils.py:68-79``), and
  the KV heads: split when there are at least as many as ranks (heads % tp == 0,
  ``:1144``), else replicated (tp % heads == 0, ``:1141-1142``); the Llama family asserts
  the same (``models/llama.py:183-193``). phi-4's 10 KV heads at TP4 or TP8 fail here.
  MLA models (DeepSeek) keep one latent KV head: only the query heads are split.
* Routed experts over the expert-parallel group: ``_num_global_routed % ep_size == 0``
  (``layers/moe/fused_moe_triton/layer.py:414``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sglang_supervisor.planner.inputs import lever_int
from sglang_supervisor.sglang.layout import Layout


def _text(config: Mapping[str, Any]) -> Mapping[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def _int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def head_problem(
    heads: int | None, kv_heads: int | None, mla: bool, levers: Mapping[str, Any], where: str
) -> tuple[str, str] | None:
    """(lever, message) when the attention TP group of ``levers`` cannot split the
    model's query or KV heads as SGLang's ``QKVParallelLinear`` requires; else None."""
    lay = Layout.of(levers)
    tp = lay.attn_tp_size
    split = f"tp_size {lay.tp_size}" + (
        f" (attention TP {tp} with attn_dp_size {lay.attn_dp_size})" if tp != lay.tp_size else ""
    )
    if heads and tp > 1 and heads % tp:
        return (
            "tp_size",
            f"{split} does not divide the model's {heads} attention heads ({where}): "
            f"SGLang 0.5.23 fails building the model (layers/linear.py:1139, "
            f"{heads} is not divisible by {tp}); use a tp_size that divides {heads}",
        )
    if kv_heads and tp > 1 and not mla:
        bad = kv_heads % tp if kv_heads >= tp else tp % kv_heads
        if bad:
            fits = [
                n
                for n in (1, 2, 4, 8, 16)
                if (kv_heads % n if kv_heads >= n else n % kv_heads) == 0
            ]
            return (
                "tp_size",
                f"{split} cannot split the model's {kv_heads} KV heads ({where}): SGLang "
                "0.5.23 splits KV heads evenly over the attention TP ranks or replicates "
                "them whole (layers/linear.py:1141-1145, models/llama.py:186-193) and "
                f"fails building the model; use e.g. tp_size "
                f"{' or '.join(str(n) for n in fits)}",
            )
    return None


def sharding_problems(
    config: Mapping[str, Any], levers: Mapping[str, Any], where: str
) -> list[tuple[str, str]]:
    """(lever, message) for each way ``levers`` split the model of ``config`` that
    SGLang's model construction refuses; ``where`` names the config.json."""
    cfg = _text(config)
    heads = _int(cfg, "num_attention_heads", "n_head")
    kv_heads = _int(cfg, "num_key_value_heads", "n_kv_heads") or heads
    mla = cfg.get("kv_lora_rank") is not None
    problems: list[tuple[str, str]] = []
    head = head_problem(heads, kv_heads, mla, levers, where)
    if head is not None:
        problems.append(head)
    experts = _int(cfg, "n_routed_experts", "num_experts", "num_local_experts")
    ep = lever_int(levers, "ep_size") or 1
    if experts and ep > 1 and experts % ep:
        problems.append(
            (
                "ep_size",
                f"ep_size {ep} does not divide the model's {experts} routed experts ({where}): "
                "SGLang 0.5.23 fails building the MoE layers "
                "(layers/moe/fused_moe_triton/layer.py:414); use an ep_size that divides "
                f"{experts}",
            )
        )
    return problems


def model_dir_sharding_problems(levers: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``sharding_problems`` for the local model directory in ``model_path``; nothing when
    it is not a local directory with a readable config.json (SGLang decides then).
    Blocking: reads the file."""
    model = levers.get("model_path")
    if not isinstance(model, str) or not model:
        return []
    path = Path(model).expanduser() / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(config, dict):
        return []
    return sharding_problems(config, levers, str(path))
