"""Lever sets: SGLang flag dest-names -> values, plus the server's extra environment.

A ``LeverSet`` is immutable. ``check_levers`` is the first-line validation against a
``FlagSchema`` (exact names only, types, choices, owned flags, the env allowlist); it
returns the canonical set or every problem found, each naming its lever. ``render_argv``
turns a checked set into an argv list — never a shell string.
"""

from __future__ import annotations

import decimal
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sglang_supervisor.sglang import lever_env, lever_limits
from sglang_supervisor.sglang.layout import size_problems
from sglang_supervisor.sglang.lever_limits import shown, text_problem
from sglang_supervisor.sglang.schema import FlagSchema, FlagSpec, normalize_name

Scalar = str | int | float | bool
Value = Scalar | list[Scalar]

#: Flags the supervisor sets itself; a lever may not change them.
OWNED_FLAGS: dict[str, str] = {
    "host": "the supervisor binds the server to its configured server.host",
    "port": "the supervisor owns the server port (server.port / --server-port)",
    "enable_metrics": "the supervisor always starts the server with --enable-metrics",
    "config": "a YAML config file would bypass lever validation; set each lever instead",
}

ENV_PREFIXES = lever_env.ENV_PREFIXES
#: Names inside the allowed prefixes that the supervisor owns.
OWNED_ENV: dict[str, str] = {
    "SGLANG_SUPERVISOR_INSTANCE": "the launch tag the supervisor uses to find every member",
    "CUDA_VISIBLE_DEVICES": "the supervisor assigns the managed GPUs (server.gpus)",
    "CUDA_DEVICE_ORDER": "the supervisor fixes the GPU order to match NVML",
}


@dataclass(frozen=True)
class LeverProblem:
    lever: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"lever": self.lever, "message": self.message}


class LeverError(ValueError):
    """One or more levers are invalid; ``problems`` names each."""

    def __init__(self, problems: list[LeverProblem]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{p.lever}: {p.message}" for p in problems))


@dataclass(frozen=True)
class LeverSet:
    levers: Mapping[str, Value] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"levers": dict(sorted(self.levers.items())), "env": dict(sorted(self.env.items()))}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LeverSet:
        return cls(levers=dict(data.get("levers") or {}), env=dict(data.get("env") or {}))

    def digest(self) -> str:
        """A short stable hash of the set (for logs and operation records)."""
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def merged(
        self,
        levers: Mapping[str, Any],
        env: Mapping[str, Any],
        *,
        replace: bool = False,
    ) -> LeverSet:
        """This set with ``levers``/``env`` applied; a ``None`` value removes the key.

        With ``replace`` the result holds only what was given.
        """
        new_levers: dict[str, Any] = {} if replace else dict(self.levers)
        new_env: dict[str, Any] = {} if replace else dict(self.env)
        for target, changes in ((new_levers, levers), (new_env, env)):
            for key, value in changes.items():
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value
        return LeverSet(new_levers, new_env)

    def diff(self, other: LeverSet) -> dict[str, dict[str, Any]]:
        """``{name: {"old": a, "new": b}}`` for every lever or env var that differs."""
        out: dict[str, dict[str, Any]] = {}
        for prefix, a, b in (("", self.levers, other.levers), ("env.", self.env, other.env)):
            for key in sorted(set(a) | set(b)):
                if a.get(key) != b.get(key):
                    out[prefix + key] = {"old": a.get(key), "new": b.get(key)}
        return out


def canonical_names(levers: Mapping[str, Any], schema: FlagSchema) -> dict[str, Any]:
    """Request keys as dest names (``tensor_parallel_size`` -> ``tp_size``), so a merge
    onto the current levers replaces (or, with None, removes) the right one. Unknown names
    are kept as given: validation reports them."""
    out: dict[str, Any] = {}
    for raw, value in levers.items():
        spec = schema.find(raw)
        key = spec.dest if spec is not None else raw
        if key in out and key != raw:
            key = raw  # two spellings of one flag: keep both, validation refuses it
        out[key] = value
    return out


def _suggest(name: str, schema: FlagSchema) -> str:
    prefixed = sorted(d for d in schema.flags if d.startswith(name))
    if prefixed:
        head = ", ".join(prefixed[:5]) + (" ..." if len(prefixed) > 5 else "")
        return (
            f"unknown lever {name!r}: abbreviations are not accepted; "
            f"did you mean {head}? (GET /levers/schema lists every flag)"
        )
    import difflib

    close = difflib.get_close_matches(name, list(schema.flags), n=3, cutoff=0.75)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return (
        f"unknown lever {name!r}: SGLang {schema.sglang_version} has no such flag{hint} "
        "(GET /levers/schema lists every flag)"
    )


def _coerce_scalar(spec: FlagSpec, value: Any) -> tuple[Scalar | None, str | None]:
    """Return (canonical value, None) or (None, reason)."""
    t = spec.type
    if isinstance(value, (dict, list)):
        if t.startswith("callable:"):
            return json.dumps(value), None
        return None, f"expected a single {t} value, got {type(value).__name__}"
    if t == "int":
        if isinstance(value, bool):
            return None, f"expected an integer, got {value!r}"
        if isinstance(value, int):
            return value, None
        if isinstance(value, float) and value.is_integer():
            return int(value), None
        if isinstance(value, str):
            try:
                return int(value.strip()), None
            except ValueError:
                pass
        return None, f"expected an integer, got {value!r}"
    if t == "float":
        if isinstance(value, bool):
            return None, f"expected a number, got {value!r}"
        if isinstance(value, (int, float)):
            f = float(value)
        elif isinstance(value, str):
            try:
                f = float(value.strip())
            except ValueError:
                return None, f"expected a number, got {value!r}"
        else:
            return None, f"expected a number, got {value!r}"
        if not math.isfinite(f):
            return None, f"expected a finite number, got {value!r}"
        return f, None
    # str and SGLang's own callables: the value travels as text.
    if isinstance(value, bool):
        return ("true" if value else "false"), None
    if isinstance(value, (int, float, str)):
        text = value if isinstance(value, str) else str(value)
        problem = text_problem(text)
        if problem is not None:
            return None, problem
        if text == "--":
            # argparse drops a bare "--" even in the --flag=-- form: it cannot arrive.
            return None, "the value '--' cannot be passed through argparse"
        return text, None
    return None, f"unsupported value {value!r}"


def _check_choice(spec: FlagSpec, value: Scalar) -> str | None:
    if spec.choices is None:
        return None
    if value in spec.choices or str(value) in {str(c) for c in spec.choices}:
        return None
    shown = ", ".join(str(c) for c in spec.choices[:20])
    more = " ..." if len(spec.choices) > 20 else ""
    return f"{value!r} is not one of the choices: {shown}{more}"


def _check_one(spec: FlagSpec, value: Any) -> tuple[Value | None, str | None]:
    if spec.boolean is not None:
        if isinstance(value, bool):
            return value, None
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true", None
        return None, f"{spec.option} is a switch: give true or false, not {value!r}"
    if spec.takes_list:
        items = value if isinstance(value, list) else [value]
        if len(items) > lever_limits.MAX_LIST_ITEMS:
            return None, (f"{len(items)} items; at most {lever_limits.MAX_LIST_ITEMS} are accepted")
        if not items and spec.nargs == "+":
            return None, f"{spec.option} needs at least one value"
        out: list[Scalar] = []
        for item in items:
            v, err = _coerce_scalar(spec, item)
            if err is None and v is not None:
                err = _check_choice(spec, v)
                if isinstance(v, str) and v.startswith("-") and not _ARGPARSE_NEGATIVE.match(v):
                    err = (
                        f"list item {shown(v)!r} starts with '-' and argparse would read it "
                        "as a flag (it takes only -N and -N.N as negative numbers; write "
                        "-1e-05 as -0.00001)"
                    )
            if err is not None:
                return None, err
            assert v is not None
            out.append(v)
        return out, None
    v, err = _coerce_scalar(spec, value)
    if err is None and v is not None:
        err = _check_choice(spec, v)
    return (v, None) if err is None else (None, err)


#: argparse's own test for "a negative number, not a flag" (``_negative_number_matcher``).
_ARGPARSE_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


def check_levers(levers: LeverSet, schema: FlagSchema, *, complete: bool = False) -> LeverSet:
    """First-line validation against ``schema``; returns the canonical set.

    Raises ``LeverError`` listing every problem (unknown or abbreviated names, owned
    flags, bad types and choices, values out of SGLang's ranges, text that cannot be
    encoded or is too long, env names outside the allowlist). ``complete``: the set is
    the whole launch, so SGLang's required flags must be in it.
    """
    problems: list[LeverProblem] = []
    canon: dict[str, Value] = {}
    spelled: dict[str, str] = {}  # dest -> the name the request used for it
    for raw_name, value in levers.levers.items():
        bad_name = text_problem(raw_name) if isinstance(raw_name, str) else "not a string"
        if bad_name is not None:
            problems.append(LeverProblem(shown(str(raw_name)), f"the lever name {bad_name}"))
            continue
        name = normalize_name(raw_name)
        if name in OWNED_FLAGS:
            problems.append(
                LeverProblem(raw_name, f"cannot be set by a lever: {OWNED_FLAGS[name]}")
            )
            continue
        spec = schema.find(name)
        if spec is None:
            problems.append(LeverProblem(raw_name, _suggest(name, schema)))
            continue
        if spec.dest in OWNED_FLAGS:
            problems.append(
                LeverProblem(raw_name, f"cannot be set by a lever: {OWNED_FLAGS[spec.dest]}")
            )
            continue
        if spec.dest in spelled:
            problems.append(
                LeverProblem(
                    raw_name,
                    f"names the same flag ({spec.option}) as lever {spelled[spec.dest]!r}; "
                    "give it once",
                )
            )
            continue
        spelled[spec.dest] = raw_name
        v, err = _check_one(spec, value)
        if err is not None:
            problems.append(LeverProblem(raw_name, f"{spec.option}: {err}"))
            continue
        assert v is not None
        canon[spec.dest] = v
    problems.extend(LeverProblem(n, m) for n, m in lever_limits.range_problems(canon))
    problems.extend(LeverProblem(n, m) for n, m in lever_limits.probe_problems(canon))
    problems.extend(LeverProblem(n, m) for n, m in size_problems(canon))
    if complete:
        problems.extend(LeverProblem(n, m) for n, m in lever_limits.required_problems(canon))
    env: dict[str, str] = {}
    for key, value in levers.env.items():
        err = check_env_name(key)
        if err is None and not isinstance(value, (str, int, float, bool)):
            err = f"value must be a string, got {type(value).__name__}"
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if err is None:
            err = text_problem(text)
        if err is not None:
            problems.append(LeverProblem(f"env.{shown(str(key))}", err))
            continue
        env[key] = text
    if not problems:
        too_big = lever_limits.launch_size_problem(render_argv(LeverSet(canon), schema), env)
        if too_big is not None:
            problems.append(LeverProblem("levers", too_big))
    if problems:
        raise LeverError(problems)
    return LeverSet(canon, env)


def check_gpu_placement(levers: LeverSet, managed_count: int) -> None:
    """Raise ``LeverError`` when ``base_gpu_id``/``gpu_id_step`` put a rank outside the
    ``managed_count`` managed GPUs (see ``lever_limits.check_gpu_ids``)."""
    found = lever_limits.check_gpu_ids(levers.levers, managed_count)
    if found:
        raise LeverError([LeverProblem(n, m) for n, m in found])


def check_env_name(key: str) -> str | None:
    """None when ``key`` may be set in the server's environment, else the reason
    (the rule: ``lever_env.env_name_problem``)."""
    return lever_env.env_name_problem(key, OWNED_ENV)


def render_argv(levers: LeverSet, schema: FlagSchema) -> list[str]:
    """Argv for a *checked* lever set, in a stable order.

    ``true`` renders a bare flag and ``false`` nothing (the reverse for store_false
    flags; ``--no-x`` for BooleanOptional ones). Values are single argv elements, verbatim;
    a value that starts with '-' uses the ``--flag=value`` form so it is never read as a flag.
    """
    argv: list[str] = []
    for dest in sorted(levers.levers):
        spec = schema.flags[dest]
        value = levers.levers[dest]
        opt = spec.option
        if spec.boolean is not None:
            if spec.boolean == "boolean_optional":
                argv.append(opt if value else "--no-" + opt[2:])
            elif spec.boolean == "store_false":
                if not value:
                    argv.append(opt)
            elif value:
                argv.append(opt)
            continue
        if isinstance(value, list):
            argv.append(opt)
            argv.extend(_text(v) for v in value)
            continue
        text = _text(value)
        if text.startswith("-"):
            argv.append(f"{opt}={text}")
        else:
            argv.extend([opt, text])
    return argv


def _text(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = repr(value)
        if text.startswith("-") and not _ARGPARSE_NEGATIVE.match(text) and math.isfinite(value):
            # argparse reads "-1e-05" as a flag: the same number in positional notation.
            return format(decimal.Decimal(text), "f")
        return text
    return str(value)
