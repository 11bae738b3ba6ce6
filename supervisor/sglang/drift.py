"""Drift: the levers where the config's ``[server.levers]``/``[server.env]`` and the
serving set differ.

The serving set is canonical already (every set the supervisor holds went through
``check_levers``). The config's levers are made canonical the same way an apply's are —
SGLang's flag names through the schema (``--tp``, ``tensor-parallel-size`` and ``tp_size``
are one lever) and values through the flag's type (``"0.85"`` is 0.85, ``"true"`` a switch
on) — so only a real difference is drift. A config that the schema refuses is compared as
written (names made canonical where the schema knows them) and its problems are returned
beside the drift: the operator sees both what differs and why the config cannot be applied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang_supervisor.redact import is_secret_name
from sglang_supervisor.sglang.levers import (
    LeverError,
    LeverProblem,
    LeverSet,
    canonical_names,
    check_levers,
)
from sglang_supervisor.sglang.schema import FlagSchema


@dataclass(frozen=True)
class DriftEntry:
    """One lever (``mem_fraction_static``) or env var (``env.NCCL_DEBUG``) that differs;
    a value of None: not set on that side (SGLang's default, or no such variable)."""

    lever: str
    config: Any
    serving: Any

    def to_json(self) -> dict[str, Any]:
        return {"lever": self.lever, "config": self.config, "serving": self.serving}


@dataclass(frozen=True)
class Drift:
    """``entries``: what differs, by name; ``problems``: why the config's levers could not
    be applied as they are (empty when they pass the schema's checks)."""

    entries: tuple[DriftEntry, ...] = ()
    problems: tuple[LeverProblem, ...] = ()

    @property
    def levers(self) -> list[str]:
        return [e.lever for e in self.entries]


def canonical_config(config: LeverSet, schema: FlagSchema) -> tuple[LeverSet, list[LeverProblem]]:
    """The config's levers as the supervisor would hold them, and the schema's problems
    with them (then the names are canonical where known and the values as written)."""
    try:
        return check_levers(config, schema), []
    except LeverError as exc:
        env = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in config.env.items()}
        return LeverSet(canonical_names(config.levers, schema), env), list(exc.problems)


def lever_drift(config: LeverSet, serving: LeverSet, schema: FlagSchema) -> Drift:
    """Where ``config`` (the config file's levers, as written) and ``serving`` (a checked
    set) differ, compared canonically (see the module's docstring)."""
    desired, problems = canonical_config(config, schema)
    entries = tuple(
        DriftEntry(name, change["new"], change["old"])
        for name, change in serving.diff(desired).items()
    )
    return Drift(entries, tuple(problems))


def hides_value(lever: str, schema: FlagSchema) -> bool:
    """Whether /status must not show a drift entry's values (``lever`` as in the entry):
    a secret in any spelling (``env.hf_token``, ``admin-api-key``), or a lever the schema
    does not know — the config's levers are shown as written when refused, and a misspelt
    secret (``api-kye``) would be shown whole otherwise."""
    if lever.startswith("env."):
        return is_secret_name("env." + lever.removeprefix("env.").upper())
    name = lever.replace("-", "_")
    return is_secret_name(name) or name not in schema.flags
