"""What the resolution probe does when the model's config is not here, run *inside the
server's interpreter*: SGLang's pipeline under stand-in configs of the families its rules
key on (``STANDINS``, ``with_standins``), and which names SGLang's raising statement
reads (``code_names``: the lever a refusal is about).

``sglang_supervisor.sglang.resolution_helper`` sends this source after ``probe_checks.py``
and before ``probe_serve.py`` in the probe's one ``-c`` program, so it imports nothing but
the standard library (and, lazily, SGLang).
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import tempfile
import traceback
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time: the same -c program (resolution_helper.probe_source)
    from sglang_supervisor.sglang.resolve_probe import _stages


#: Stand-in model configs for a hub id whose config is not cached, chosen to split the
#: model families SGLang's rules key on: a dense Llama with full heads, a dense Qwen2 with
#: grouped KV heads, and an MLA mixture of experts with a multi-token-prediction layer
#: (DeepSeek-V3's shape: rules "only supported for MLA models", MoE and MTP ones). A
#: refusal is SGLang's verdict on the levers only when it is the same under all of them
#: (then no model fact could have decided it).
STANDINS: tuple[dict[str, Any], ...] = (
    {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "head_dim": 64,
        "num_hidden_layers": 32,
        "max_position_embeddings": 131072,
        "vocab_size": 128256,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
    },
    {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "num_hidden_layers": 28,
        "max_position_embeddings": 32768,
        "vocab_size": 152064,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
    },
    {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "num_hidden_layers": 61,
        "first_k_dense_replace": 3,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "n_group": 8,
        "topk_group": 4,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "num_nextn_predict_layers": 1,
        "max_position_embeddings": 163840,
        "vocab_size": 129280,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
    },
)


def standin_dir(index: int) -> str:
    """A directory holding stand-in config ``index`` (made once per process)."""
    path = os.path.join(tempfile.gettempdir(), f"sglang-supervisor-standin-{os.getpid()}-{index}")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(STANDINS[index], f)
    return path


#: How many of SGLang's frames, innermost first, are read for the names of a refusal.
CODE_FRAMES = 3


def _names_at(path: str, line: int) -> list[str]:
    """The attribute and variable names of the statement at ``path:line`` and of the
    conditions it sits under, innermost first (``assert cfg.tp_size % cfg.attn_dp_size
    == 0`` -> tp_size, attn_dp_size, ...): what SGLang's rule tested."""
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return []
    chain: list[ast.stmt] = []  # the statements enclosing the line, outermost first
    node: ast.AST = tree
    while True:
        inner = [
            c
            for c in ast.iter_child_nodes(node)
            if isinstance(c, ast.stmt) and c.lineno <= line <= (c.end_lineno or c.lineno)
        ]
        if not inner:
            break
        node = inner[0]
        chain.append(inner[0])
    names: list[str] = []
    for depth, stmt in enumerate(reversed(chain)):
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            break
        if depth == 0:
            part: ast.AST = stmt  # the raising statement itself
        elif isinstance(stmt, ast.If | ast.While):
            part = stmt.test  # a condition it sits under
        else:
            continue
        for sub in ast.walk(part):
            name = sub.attr if isinstance(sub, ast.Attribute) else getattr(sub, "id", None)
            if isinstance(name, str) and name not in names:
                names.append(name)
    return names


def code_names(exc: BaseException) -> list[list[str]]:
    """For SGLang's innermost frames of ``exc``: the names its raising statement and
    enclosing conditions read (the daemon keeps those that are levers)."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if "/sglang/" in f.filename.replace(os.sep, "/")
    ]
    return [_names_at(f.filename, f.lineno or 0) for f in reversed(frames[-CODE_FRAMES:])]


def not_run_item(check: str, reason: str) -> dict[str, str]:
    """One entry of the verdict's ``not_run``: what did not run, and why."""
    return {"check": check, "reason": reason[:600]}


def _parse_quietly(argv: list[str]) -> Any:
    """SGLang's ``prepare_server_args`` (a fresh record: resolution mutates it)."""
    from sglang.srt.server_args import prepare_server_args

    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return prepare_server_args(argv)


def with_standins(argv: list[str], model: str, missing: str, out: dict[str, Any]) -> Any:
    """SGLang's resolution and checks with stand-in configs in place of the model's.

    Each stand-in (``STANDINS``: families SGLang's rules key on) runs the
    whole pipeline; a refusal is reported only when all give the same one (no model fact
    decided it), else it is a check that did not run. Returns the refusal or None."""
    answers = []
    for i in range(len(STANDINS)):
        args = _parse_quietly(argv)
        args.model_path = standin_dir(i)
        if args.served_model_name is None:  # SGLang names the server after model_path
            args.served_model_name = model
        sub: dict[str, Any] = {"not_run": [], "timings": out["timings"]}
        answers.append((_stages(args, sub), sub["not_run"]))
    refusals = [refusal for refusal, _ in answers]
    first = refusals[0]
    out["not_run"].extend(answers[0][1])
    if all(
        r is not None and first is not None and r["message"] == first["message"] for r in refusals
    ):
        return first
    for refusal in refusals:
        if refusal is not None:
            under = [STANDINS[i]["architectures"][0] for i, r in enumerate(refusals) if r]
            spared = [STANDINS[i]["architectures"][0] for i, r in enumerate(refusals) if not r]
            also = f", not under {', '.join(spared)}" if spared else ", with other words"
            out["not_run"].append(
                not_run_item(
                    f"SGLang's {refusal['stage']} at {refusal['where']}",
                    f"refused under the stand-in {', '.join(under)}{also} "
                    f"({refusal['message']}): it depends on the model, whose config is not "
                    "here",
                )
            )
            break
    out["not_run"].append(
        not_run_item(
            "SGLang's model-dependent resolution and checks",
            f"needs the model config: {missing}; the model-independent checks ran with "
            "stand-in configs",
        )
    )
    return None
