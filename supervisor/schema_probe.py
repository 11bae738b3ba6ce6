"""Print the installed SGLang's launch flags as JSON.

Runs *inside the SGLang interpreter* (``python -m supervisor.schema_probe`` is not
needed: the supervisor runs this file by path), so it must import nothing but the standard
library and SGLang. It builds SGLang's own parser through ``ServerArgs.add_cli_args``
and describes every action: dest, option strings, type, choices, default, nargs, help
and, for booleans, which kind of flag it is.

Output: ``{"sglang_version": "...", "flags": [{...}, ...]}`` on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _type_name(action: argparse.Action) -> str:
    t = action.type
    if t is None:
        return "str"
    if t in (int, float, str):
        return t.__name__
    name = getattr(t, "__name__", None) or type(t).__name__
    return f"callable:{name}"


def _bool_kind(action: argparse.Action) -> str | None:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "boolean_optional"
    if isinstance(action, argparse._StoreTrueAction):
        return "store_true"
    if isinstance(action, argparse._StoreFalseAction):
        return "store_false"
    if action.nargs == 0:
        # Custom zero-argument actions (SGLang's deprecated store_true spellings).
        return "flag"
    return None


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, float) and value != value:  # NaN is not JSON
            return None
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


def describe(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    flags = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        choices = action.choices
        boolean = _bool_kind(action)
        flags.append(
            {
                "dest": action.dest,
                "option_strings": list(action.option_strings),
                "type": "bool" if boolean else _type_name(action),
                "boolean": boolean,
                "choices": None if choices is None else sorted(_jsonable(list(choices)), key=str),
                "default": _jsonable(action.default),
                "nargs": action.nargs,
                "help": (action.help or "") if action.help != argparse.SUPPRESS else "",
                "deprecated": "deprecated" in type(action).__name__.lower()
                or (action.help or "").lower().startswith(("deprecated", "(deprecated")),
            }
        )
    return flags


def main() -> int:
    try:
        import sglang
        from sglang.srt.server_args import ServerArgs
    except Exception as exc:  # ImportError, or SGLang failing at import
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 3
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    version = getattr(sglang, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("sglang")
    json.dump({"sglang_version": version, "flags": describe(parser)}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
