"""Drift: the config's levers against the serving set, compared by SGLang's canonical
names and types (supervisor/sglang/drift.py), and what a daemon start launches with each
``levers_source`` (supervisor/engine/desired.py ``levers_to_start``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sglang_supervisor.config import ServerSettings
from sglang_supervisor.engine.desired import DesiredLevers, levers_to_start
from sglang_supervisor.redact import REDACTED
from sglang_supervisor.sglang.drift import lever_drift
from sglang_supervisor.sglang.levers import LeverSet, check_levers
from sglang_supervisor.sglang.schema import load_bundled

SCHEMA = load_bundled()
SERVING = check_levers(
    LeverSet(
        {"model_path": "m", "tp_size": 2, "mem_fraction_static": 0.85}, {"NCCL_DEBUG": "INFO"}
    ),
    SCHEMA,
)


def drift_of(levers: dict[str, Any], env: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    d = lever_drift(LeverSet(levers, env or {}), SERVING, SCHEMA)
    return [(e.lever, e.config, e.serving) for e in d.entries]


def test_the_same_set_spelled_as_sglang_flags_is_no_drift() -> None:
    # --tensor-parallel-size is tp_size; "0.85" is the float 0.85; env values are text.
    assert (
        drift_of(
            {"model-path": "m", "--tensor-parallel-size": 2, "mem_fraction_static": "0.85"},
            {"NCCL_DEBUG": "INFO"},
        )
        == []
    )
    assert (
        drift_of(
            {"model_path": "m", "tp-size": "2", "mem-fraction-static": 0.85}, {"NCCL_DEBUG": "INFO"}
        )
        == []
    )


def test_a_changed_value_names_the_lever_with_both_values() -> None:
    got = drift_of(
        {"model_path": "m", "tp_size": 2, "mem_fraction_static": 0.9}, {"NCCL_DEBUG": "INFO"}
    )
    assert got == [("mem_fraction_static", 0.9, 0.85)]


def test_a_lever_or_env_var_on_one_side_only_is_drift_with_none_on_the_other() -> None:
    got = drift_of(
        {"model_path": "m", "tp_size": 2, "mem_fraction_static": 0.85, "chunked_prefill_size": 4096}
    )
    assert got == [("chunked_prefill_size", 4096, None), ("env.NCCL_DEBUG", None, "INFO")]


def test_an_invalid_config_is_compared_as_written_and_its_problems_returned() -> None:
    d = lever_drift(
        LeverSet(
            {
                "model_path": "m",
                "tensor-parallel-size": 2,
                "mem_fraction_static": 0.85,
                "no_such_flag": 1,
            },
            {"NCCL_DEBUG": "INFO"},
        ),
        SERVING,
        SCHEMA,
    )
    # tp_size still canonical: only the unknown flag differs, and it is named as refused.
    assert [(e.lever, e.config, e.serving) for e in d.entries] == [("no_such_flag", 1, None)]
    assert [p.lever for p in d.problems] == ["no_such_flag"]
    assert "no such flag" in d.problems[0].message


def _start(
    source: str, config: dict[str, Any], persisted: LeverSet | None, *, adopting: bool = False
) -> tuple[LeverSet, list[str]]:
    """What a daemon start launches, and the warnings it gave."""
    warnings: list[str] = []
    desired = DesiredLevers(ServerSettings(levers=config, levers_source=source)).view()
    chosen = levers_to_start(desired, SCHEMA, persisted, adopting=adopting, warn=warnings.append)
    return chosen, warnings


CONFIG = {"model_path": "m", "tp_size": 2, "mem_fraction_static": 0.8}
LAST_APPLIED = check_levers(
    LeverSet({"model_path": "m", "tp_size": 2, "mem_fraction_static": 0.9}), SCHEMA
)


def test_with_api_the_last_applied_levers_win_at_start() -> None:
    assert _start("api", CONFIG, LAST_APPLIED)[0] == LAST_APPLIED
    # Nothing persisted: the config's.
    assert _start("api", CONFIG, None)[0].levers["mem_fraction_static"] == 0.8


def test_with_config_the_configs_levers_win_at_start() -> None:
    assert _start("config", CONFIG, LAST_APPLIED)[0].levers["mem_fraction_static"] == 0.8


def test_with_config_a_server_to_adopt_keeps_what_it_runs() -> None:
    assert _start("config", CONFIG, LAST_APPLIED, adopting=True)[0] == LAST_APPLIED


def test_with_config_invalid_config_levers_start_the_last_applied_and_say_why() -> None:
    chosen, warnings = _start("config", {**CONFIG, "mem_fraction_static": "lots"}, LAST_APPLIED)
    assert chosen == LAST_APPLIED
    assert any("mem_fraction_static" in w and "last applied" in w for w in warnings)


def test_invalid_config_levers_and_nothing_persisted_refuse_to_start() -> None:
    with pytest.raises(ValueError, match="mem_fraction_static"):
        _start("config", {**CONFIG, "mem_fraction_static": "lots"}, None)


def test_status_hides_a_secret_however_spelt_and_an_unknown_levers_value() -> None:
    """A refused config is shown as written: ``env.hf_token`` (lower case) and a misspelt
    ``api-kye`` were shown whole to every reader of /status, the read-only token's too."""
    config = ServerSettings(
        levers={**CONFIG, "api-kye": "sk-typo-secret", "admin-api-key": "sk-dash-secret"},
        env={"hf_token": "hf_lower_secret"},
    )
    shown = DesiredLevers(config).view().status_json(SERVING, SCHEMA, 42)
    text = json.dumps(shown)
    assert "typo-secret" not in text and "dash-secret" not in text, text
    assert "lower_secret" not in text, text
    drift = {e["lever"]: e["config"] for e in shown["drift"]}
    assert drift["api-kye"] == REDACTED and drift["env.hf_token"] == REDACTED, drift
    assert drift["mem_fraction_static"] == 0.8  # an ordinary value is still shown
