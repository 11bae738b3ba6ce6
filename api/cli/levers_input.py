"""What ``apply`` changes, read from the command line and a levers file: ``--set`` values
read like TOML scalars, lever names as SGLang's dest names."""

from __future__ import annotations

import argparse
import math
import tomllib
from pathlib import Path
from typing import Any

from sglang_supervisor_api.cli.exits import UsageError


def parse_value(raw: str) -> Any:
    """A ``--set`` value read like a TOML scalar: ``true``/``false``, ints, floats,
    ``"quoted"`` strings, arrays of those; anything else is the string as given."""
    text = raw.strip()
    if not text or "\n" in text or "\r" in text:
        return raw
    try:
        parsed = tomllib.loads(f"v = {text}")
    except tomllib.TOMLDecodeError:
        return raw
    if set(parsed) != {"v"}:
        return raw
    v = parsed["v"]
    if _plain(v) or (isinstance(v, list) and all(_plain(x) for x in v)):
        return v
    return raw


def _plain(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    return isinstance(v, (bool, int, str))


def lever_name(name: str) -> str:
    """``--mem-fraction-static`` / ``mem-fraction-static`` -> ``mem_fraction_static``."""
    return name.strip().lstrip("-").replace("-", "_")


def _assignment(item: str, option: str) -> tuple[str, str]:
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"{option} {item!r}: expected NAME=VALUE")
    return key.strip(), raw


def read_levers_file(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``([levers], [env])`` of a TOML file. Raises ``UsageError``."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from exc
    unknown = sorted(set(data) - {"levers", "env"})
    if unknown:
        raise UsageError(
            f"{path}: unexpected {', '.join(unknown)} (the file holds [levers] and [env] tables)"
        )
    levers, env = data.get("levers", {}), data.get("env", {})
    if not isinstance(levers, dict) or not isinstance(env, dict):
        raise UsageError(f"{path}: levers and env must be tables ([levers], [env])")
    return {lever_name(k): v for k, v in levers.items()}, dict(env)


def lever_changes_from_args(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``levers`` and ``env`` of ``apply``: the file, then ``--set``/``--env``/``--unset``
    (a ``None`` value removes). Raises ``UsageError``."""
    levers: dict[str, Any] = {}
    env: dict[str, Any] = {}
    if args.file is not None:
        levers, env = read_levers_file(args.file)
    for item in args.set_:
        key, raw = _assignment(item, "--set")
        levers[lever_name(key)] = parse_value(raw)
    for item in args.env:
        key, raw = _assignment(item, "--env")
        env[key] = raw
    for name in args.unset:
        if name.startswith("env."):
            env[name[4:]] = None
        else:
            levers[lever_name(name)] = None
    return levers, env
