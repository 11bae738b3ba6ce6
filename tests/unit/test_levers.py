"""Lever sets: first-line validation against the bundled SGLang schema, argv rendering.

Every refusal must name the lever the operator sent; every accepted set must reach the
server as exactly the values that were checked (argv elements, never a shell string).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_supervisor.sglang import lever_limits
from sglang_supervisor.sglang.levers import (
    LeverError,
    LeverSet,
    check_levers,
    normalize_name,
    render_argv,
)
from sglang_supervisor.sglang.schema import FlagSchema, FlagSpec, load_bundled

SCHEMA = load_bundled()


def problems(levers: Mapping[str, Any], env: Mapping[str, Any] | None = None) -> dict[str, str]:
    """``{lever: message}`` of the LeverError ``check_levers`` raises."""
    with pytest.raises(LeverError) as info:
        check_levers(LeverSet(dict(levers), dict(env or {})), SCHEMA)
    return {p.lever: p.message for p in info.value.problems}


def checked(levers: Mapping[str, Any], env: Mapping[str, Any] | None = None) -> LeverSet:
    return check_levers(LeverSet(dict(levers), dict(env or {})), SCHEMA)


# ------------------------------------------------------------------ refusals


def test_unknown_flag_is_refused_by_name() -> None:
    got = problems({"mem_fracton_static": 0.9})
    msg = got["mem_fracton_static"]
    assert "has no such flag" in msg
    assert "did you mean mem_fraction_static" in msg


def test_abbreviation_is_refused_with_did_you_mean() -> None:
    """argparse would accept ``--mem-fraction``; a lever must be spelled out."""
    msg = problems({"mem_fraction": 0.9})["mem_fraction"]
    assert "abbreviations are not accepted" in msg
    assert "did you mean mem_fraction_static" in msg


def test_abbreviation_with_dashes_is_refused_too() -> None:
    assert "abbreviations are not accepted" in problems({"--mem-fraction": 0.9})["--mem-fraction"]


def test_bad_choice_lists_the_choices() -> None:
    msg = problems({"kv_cache_dtype": "fp9"})["kv_cache_dtype"]
    assert "'fp9' is not one of the choices" in msg
    assert "fp8_e4m3" in msg
    assert msg.startswith("--kv-cache-dtype")


@pytest.mark.parametrize(
    ("lever", "value", "expected"),
    [
        ("max_running_requests", "lots", "expected an integer, got 'lots'"),
        ("max_running_requests", 1.5, "expected an integer"),
        ("tp_size", True, "expected an integer, got True"),
        ("mem_fraction_static", "high", "expected a number, got 'high'"),
        ("mem_fraction_static", False, "expected a number"),
        ("mem_fraction_static", math.nan, "expected a finite number"),
        ("mem_fraction_static", math.inf, "expected a finite number"),
        ("enable_hierarchical_cache", "yes", "is a switch: give true or false"),
        ("enable_hierarchical_cache", 1, "is a switch"),
        ("hicache_size", [1, 2], "expected a single int value"),
        ("served_model_name", {"a": 1}, "expected a single str value"),
    ],
)
def test_bad_type_is_refused(lever: str, value: Any, expected: str) -> None:
    assert expected in problems({lever: value})[lever]


@pytest.mark.parametrize("flag", ["host", "port", "enable_metrics", "config", "--port", "--host"])
def test_owned_flags_cannot_be_levers(flag: str) -> None:
    assert "cannot be set by a lever" in problems({flag: "x"})[flag]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("LD_PRELOAD", "is not allowed"),
        ("LD_LIBRARY_PATH", "is not allowed"),
        ("PYTHONPATH", "is not allowed"),
        ("PYTHONSTARTUP", "is not allowed"),
        ("PATH", "is not allowed"),
        ("CUDA_VISIBLE_DEVICES", "the supervisor assigns the managed GPUs"),
        ("CUDA_DEVICE_ORDER", "cannot be set by a lever"),
        ("SGLANG_SUPERVISOR_INSTANCE", "cannot be set by a lever"),
        ("nccl_debug", "not a valid environment variable name"),
        ("NCCL DEBUG", "not a valid environment variable name"),
    ],
)
def test_env_outside_the_allowlist_is_refused(name: str, expected: str) -> None:
    assert expected in problems({}, {name: "1"})[f"env.{name}"]


def test_env_in_the_allowlist_is_accepted_as_text() -> None:
    got = checked({}, {"NCCL_DEBUG": "INFO", "SGLANG_X": 1, "TORCH_Y": True, "PYTORCH_Z": 0.5})
    assert dict(got.env) == {
        "NCCL_DEBUG": "INFO",
        "SGLANG_X": "1",
        "TORCH_Y": "true",
        "PYTORCH_Z": "0.5",
    }


def test_nul_byte_is_refused_in_values_and_env() -> None:
    got = problems({"served_model_name": "a\x00b"}, {"NCCL_DEBUG": "IN\x00FO"})
    assert "NUL byte" in got["served_model_name"]
    assert "NUL byte" in got["env.NCCL_DEBUG"]


def test_env_value_must_be_a_scalar() -> None:
    assert "must be a string" in problems({}, {"NCCL_DEBUG": ["a"]})["env.NCCL_DEBUG"]


def test_every_problem_is_reported_at_once() -> None:
    got = problems(
        {
            "mem_fraction": 0.9,
            "kv_cache_dtype": "fp9",
            "port": 1234,
            "max_running_requests": "many",
            "tp_size": 2,  # fine: not reported
        },
        {"LD_PRELOAD": "/tmp/evil.so", "NCCL_DEBUG": "INFO"},
    )
    assert list(got) == [
        "mem_fraction",
        "kv_cache_dtype",
        "port",
        "max_running_requests",
        "env.LD_PRELOAD",
    ]


def test_lever_error_message_names_each_lever() -> None:
    with pytest.raises(LeverError) as info:
        checked({"mem_fraction": 0.9, "kv_cache_dtype": "fp9"})
    text = str(info.value)
    assert "mem_fraction:" in text
    assert "kv_cache_dtype:" in text


# ---------------------------------------------------------------- canonical


@pytest.mark.parametrize(
    ("given_name", "dest"),
    [
        ("tensor_parallel_size", "tp_size"),
        ("--tensor-parallel-size", "tp_size"),
        ("tp-size", "tp_size"),
        ("enable_hicache", "enable_hierarchical_cache"),
        ("model", "model_path"),
        ("--mem-fraction-static", "mem_fraction_static"),
        ("fp8_gemm_backend", "fp8_gemm_runner_backend"),  # an option that is not its dest
    ],
)
def test_alias_option_names_are_canonicalised(given_name: str, dest: str) -> None:
    spec = SCHEMA.flags[dest]
    value: Any = True if spec.boolean else ("2" if spec.type == "int" else "x")
    if spec.choices:
        value = spec.choices[0]
    if spec.type == "float":
        value = "0.5"
    got = checked({given_name: value})
    assert list(got.levers) == [dest]


def test_values_are_coerced_to_the_flag_type() -> None:
    got = checked(
        {
            "tp_size": "4",
            "max_running_requests": 256.0,
            "mem_fraction_static": 1,
            "enable_hierarchical_cache": "True",
            "served_model_name": 7,
            "gc_threshold": ["700", 10],
        }
    )
    assert dict(got.levers) == {
        "tp_size": 4,
        "max_running_requests": 256,
        "mem_fraction_static": 1.0,
        "enable_hierarchical_cache": True,
        "served_model_name": "7",
        "gc_threshold": [700, 10],
    }
    assert isinstance(got.levers["mem_fraction_static"], float)


def test_alias_and_dest_in_one_request_is_refused_as_a_duplicate() -> None:
    got = problems({"tp_size": 8, "tensor_parallel_size": 4})
    assert "names the same flag (--tp-size) as lever 'tp_size'" in got["tensor_parallel_size"]


def test_alias_and_dest_in_one_request_is_refused_whatever_the_order() -> None:
    got = problems({"tensor_parallel_size": 4, "tp_size": 8})
    assert "names the same flag (--tp-size)" in " ".join(got.values())


def test_normalize_name() -> None:
    assert normalize_name("--mem-fraction-static") == "mem_fraction_static"
    assert normalize_name(" mem-fraction-static ") == "mem_fraction_static"


# ------------------------------------------------------------------- argv


def test_render_true_is_a_bare_flag_and_false_is_nothing() -> None:
    on = checked({"enable_hierarchical_cache": True, "disable_radix_cache": False})
    assert render_argv(on, SCHEMA) == ["--enable-hierarchical-cache"]


def test_render_boolean_optional_false_is_the_no_flag() -> None:
    levers = checked({"enable_tf32_matmul": False})
    assert render_argv(levers, SCHEMA) == ["--no-enable-tf32-matmul"]
    levers = checked({"enable_tf32_matmul": True})
    assert render_argv(levers, SCHEMA) == ["--enable-tf32-matmul"]


def test_render_values_in_a_stable_order() -> None:
    levers = checked({"tp_size": 8, "mem_fraction_static": 0.93, "kv_cache_dtype": "fp8_e4m3"})
    assert render_argv(levers, SCHEMA) == [
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--mem-fraction-static",
        "0.93",
        "--tp-size",
        "8",
    ]


def test_render_keeps_shell_metacharacters_verbatim_in_one_element() -> None:
    nasty = 'a; rm -rf / $(x) "q" `y` | z > w'
    argv = render_argv(checked({"served_model_name": nasty}), SCHEMA)
    assert argv == ["--served-model-name", nasty]


@pytest.mark.parametrize(
    ("lever", "value", "element"),
    [
        ("served_model_name", "-weird-name", "--served-model-name=-weird-name"),
        ("served_model_name", "--also", "--served-model-name=--also"),
        ("chunked_prefill_size", -1, "--chunked-prefill-size=-1"),
        ("random_seed", -5, "--random-seed=-5"),
    ],
)
def test_render_a_value_starting_with_dash_uses_equals(
    lever: str, value: Any, element: str
) -> None:
    assert render_argv(checked({lever: value}), SCHEMA) == [element]


def test_render_list_values_as_separate_elements() -> None:
    argv = render_argv(checked({"gc_threshold": [700, 10, 10]}), SCHEMA)
    assert argv == ["--gc-threshold", "700", "10", "10"]


def test_list_item_starting_with_dash_is_refused() -> None:
    spec = next(
        f for f in SCHEMA.flags.values() if f.takes_list and f.type == "str" and not f.choices
    )
    msg = problems({spec.dest: ["ok", "-x"]})[spec.dest]
    assert "starts with '-'" in msg


# ------------------------------------------------------------------ LeverSet


def test_merged_updates_adds_and_none_removes() -> None:
    base = LeverSet({"tp_size": 8, "mem_fraction_static": 0.85}, {"NCCL_DEBUG": "INFO"})
    new = base.merged(
        {"mem_fraction_static": 0.9, "kv_cache_dtype": "fp8_e4m3", "tp_size": None},
        {"NCCL_DEBUG": None, "SGLANG_X": "1"},
    )
    assert dict(new.levers) == {"mem_fraction_static": 0.9, "kv_cache_dtype": "fp8_e4m3"}
    assert dict(new.env) == {"SGLANG_X": "1"}
    assert dict(base.levers) == {"tp_size": 8, "mem_fraction_static": 0.85}  # unchanged


def test_merged_with_replace_keeps_only_what_was_given() -> None:
    base = LeverSet({"tp_size": 8, "mem_fraction_static": 0.85}, {"NCCL_DEBUG": "INFO"})
    new = base.merged({"tp_size": 4, "kv_cache_dtype": None}, {}, replace=True)
    assert dict(new.levers) == {"tp_size": 4}
    assert dict(new.env) == {}


def test_diff_names_each_change() -> None:
    a = LeverSet({"tp_size": 8, "mem_fraction_static": 0.85}, {"NCCL_DEBUG": "INFO"})
    b = LeverSet({"tp_size": 8, "mem_fraction_static": 0.9, "kv_cache_dtype": "fp8_e4m3"}, {})
    assert a.diff(b) == {
        "env.NCCL_DEBUG": {"old": "INFO", "new": None},
        "kv_cache_dtype": {"old": None, "new": "fp8_e4m3"},
        "mem_fraction_static": {"old": 0.85, "new": 0.9},
    }
    assert a.diff(a) == {}


def test_digest_is_stable_and_order_independent() -> None:
    a = LeverSet({"tp_size": 8, "mem_fraction_static": 0.85}, {"NCCL_DEBUG": "INFO"})
    b = LeverSet({"mem_fraction_static": 0.85, "tp_size": 8}, {"NCCL_DEBUG": "INFO"})
    assert a.digest() == b.digest()
    assert len(a.digest()) == 12
    assert LeverSet.from_json(a.to_json()).digest() == a.digest()
    assert a.digest() != a.merged({"tp_size": 4}, {}).digest()
    assert a.digest() != a.merged({}, {"NCCL_DEBUG": "WARN"}).digest()


# -------------------------------------------------- property: argv round trip

#: A handful of real flags of each kind.
PROPERTY_FLAGS = [
    "mem_fraction_static",  # float
    "kv_cache_dtype",  # str with choices
    "hicache_write_policy",  # str with choices
    "enable_hierarchical_cache",  # store_true
    "disable_radix_cache",  # store_true
    "enable_tf32_matmul",  # BooleanOptionalAction
    "max_running_requests",  # int
    "chunked_prefill_size",  # int
    "served_model_name",  # free text
    "model_path",  # free text
]

_TYPES: dict[str, type] = {"int": int, "float": float, "str": str}


def parser_for(schema: FlagSchema, dests: list[str]) -> argparse.ArgumentParser:
    """A parser with the same option strings, types and actions as SGLang's for ``dests``."""
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False, exit_on_error=False)
    for dest in dests:
        spec: FlagSpec = schema.flags[dest]
        if spec.boolean == "store_true":
            parser.add_argument(*spec.option_strings, dest=dest, action="store_true")
        elif spec.boolean == "boolean_optional":
            positive = [o for o in spec.option_strings if not o.startswith("--no-")]
            parser.add_argument(
                *positive, dest=dest, action=argparse.BooleanOptionalAction, default=None
            )
        else:
            parser.add_argument(
                *spec.option_strings, dest=dest, type=_TYPES[spec.type], choices=spec.choices
            )
    return parser


def _value_strategy(spec: FlagSpec) -> st.SearchStrategy[Any]:
    if spec.boolean is not None:
        return st.booleans()
    if spec.choices:
        return st.sampled_from(spec.choices)
    lo, lo_incl, hi, hi_incl, _ = lever_limits.RANGES.get(spec.dest, (None, True, None, True, ""))
    if spec.type == "float":
        return st.floats(
            min_value=lo,
            max_value=hi,
            exclude_min=not lo_incl,
            exclude_max=not hi_incl,
            allow_nan=False,
            allow_infinity=False,
        )
    if spec.type == "int":
        return st.integers(
            min_value=-(2**40) if lo is None else int(lo),
            max_value=2**40 if hi is None else int(hi),
        )
    # "--" alone is the one text argparse cannot carry: check_levers refuses it (tested below).
    # Lone surrogates have no UTF-8 encoding: refused (tested in test_lever_limits).
    text = st.text(
        alphabet=st.characters(exclude_characters="\x00", exclude_categories=("Cs",)),
        max_size=30,
    )
    dashed = text.map(lambda t: "-" + t)  # values that look like flags, often
    return st.one_of(text, dashed).filter(lambda v: v != "--")


LEVER_SETS = st.fixed_dictionaries(
    {}, optional={d: _value_strategy(SCHEMA.flags[d]) for d in PROPERTY_FLAGS}
)


@settings(max_examples=300, deadline=None)
@given(LEVER_SETS)
def test_argparse_reads_back_exactly_the_checked_values(levers: dict[str, Any]) -> None:
    canon = check_levers(LeverSet(levers, {}), SCHEMA)
    argv = render_argv(canon, SCHEMA)
    assert all(isinstance(a, str) for a in argv)
    parsed = vars(parser_for(SCHEMA, PROPERTY_FLAGS).parse_args(argv))
    for dest, value in canon.levers.items():
        assert parsed[dest] == value, (dest, argv)
        assert type(parsed[dest]) is type(value), (dest, argv)
    for dest in set(PROPERTY_FLAGS) - set(canon.levers):
        assert parsed[dest] in (None, False), dest  # not set: the parser's default


def test_a_value_argparse_cannot_carry_is_refused_or_carried() -> None:
    """Either the lever is refused up front, or the server reads back exactly '--'."""
    try:
        canon = checked({"served_model_name": "--"})
    except LeverError:
        return
    argv = render_argv(canon, SCHEMA)
    parsed = vars(parser_for(SCHEMA, ["served_model_name"]).parse_args(argv))
    assert parsed["served_model_name"] == "--", argv


@settings(max_examples=200, deadline=None)
@given(LEVER_SETS)
def test_checking_is_idempotent(levers: dict[str, Any]) -> None:
    once = check_levers(LeverSet(levers, {}), SCHEMA)
    assert check_levers(once, SCHEMA) == once
    assert check_levers(once, SCHEMA).digest() == once.digest()
