"""Which lever a refusal of SGLang 0.5.23 names (``parser.refusal_levers``): the one its
rule is about, from its message and from the statement that raised it (the names
``resolve_probe.code_names`` read there, innermost frame first) — never the context
levers (``model_path``, ``tp_size``) when something more specific is named, never the
vague ``levers`` when the code names one. Each case is a refusal of
tests/integration/sglang_corpus.py, with SGLang's message and the names its raising
statement reads (the line cited)."""

from __future__ import annotations

from typing import Any

import pytest

from sglang_supervisor.sglang.parser import refusal_levers
from sglang_supervisor.sglang.schema import load_bundled

SCHEMA = load_bundled()
M = {"model_path": "/models/m"}


@pytest.mark.parametrize(
    ("levers", "message", "code", "lever"),
    [
        # parallel_hook.py:326: assert cfg.tp_size % cfg.attn_dp_size == 0 (no message).
        ({**M, "tp_size": 8, "attn_dp_size": 3}, "", [["tp_size", "attn_dp_size"]], "attn_dp_size"),
        # parallel_hook.py:159: it names tp_size first, but the rule is attn_cp_size's.
        (
            {**M, "tp_size": 8, "attn_cp_size": 3},
            "tp_size must be divisible by attn_cp_size",
            [["tp_size", "attn_cp_size", "cfg", "view"]],
            "attn_cp_size",
        ),
        # validation_hook.py:275: the message's words are not the lever's name.
        (
            {**M, "mm_processor_worker_num": -1},
            "Multimodal processor worker num must >= 0",
            [["mm_processor_worker_num", "cfg"]],
            "mm_processor_worker_num",
        ),
        # kv_cache_hook.py:451: raised under `if ...(cfg.speculative_algorithm)...` under
        # `if cfg.enable_lmcache`.
        (
            {**M, "enable_lmcache": True, "speculative_algorithm": "NGRAM"},
            "LMCacheUnifiedRadixCache does not yet support speculative decoding",
            [["NotImplementedError", "speculative_algorithm", "cfg", "enable_lmcache"]],
            "speculative_algorithm",
        ),
        (
            {**M, "enable_lmcache": True, "tp_size": 8, "attn_dp_size": 8},
            "LMCacheUnifiedRadixCache does not yet support DP attention",
            [["NotImplementedError", "attn_dp_enabled_of", "cfg", "enable_lmcache"]],
            "enable_lmcache",
        ),
        # pd_disaggregation_hook.py:146: both values are in the message; the assert
        # tests the transfer backend.
        (
            {**M, "disaggregation_mode": "prefill", "disaggregation_transfer_backend": "fake"},
            "Prefill server does not support 'fake' as the transfer backend",
            [["disaggregation_transfer_backend", "cfg", "disaggregation_mode"]],
            "disaggregation_transfer_backend",
        ),
        # The message's own lever still comes first (validation_hook.py:215).
        (
            {**M, "served_model_name": "llama:v2"},
            "served_model_name cannot contain a colon (':') ...",
            [["served_model_name", "cfg"]],
            "served_model_name",
        ),
        # lora_hook.py:152: the message names levers the request lacks: they come first.
        (
            {**M, "enable_lora": True},
            "When no initial --lora-paths is provided, you need to specify both "
            "--max-lora-rank and --lora-target-modules for LoRA initialization.",
            [["lora_paths", "cfg", "max_lora_rank", "lora_target_modules", "enable_lora"]],
            "lora_paths",
        ),
    ],
)
def test_a_refusal_names_the_lever_its_rule_is_about(
    levers: dict[str, Any], message: str, code: list[list[str]], lever: str
) -> None:
    named = refusal_levers(message, SCHEMA, list(levers), levers, code)
    assert named[0] == lever, named


def test_context_levers_are_named_only_when_nothing_else_is() -> None:
    levers = {**M, "tp_size": 8}
    assert refusal_levers("tp_size 8 is odd", SCHEMA, list(levers), levers, []) == ["tp_size"]
    assert refusal_levers("refused", SCHEMA, list(levers), levers, [["cfg"]]) == []


def test_a_lever_the_message_spells_first_wins_over_the_codes_order() -> None:
    """validation_hook.py:74-77: raised under `if cfg.enable_custom_logit_processor`, but
    SGLang's words put --enable-watermark first: the rule is the watermark's."""
    levers = {**M, "enable_watermark": True, "enable_custom_logit_processor": True}
    message = "--enable-watermark is incompatible with --enable-custom-logit-processor"
    code = [["ValueError", "enable_custom_logit_processor", "cfg"]]
    assert refusal_levers(message, SCHEMA, list(levers), levers, code)[0] == "enable_watermark"
