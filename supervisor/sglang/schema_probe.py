"""Ask the installed SGLang about its launch flags; runs *inside the SGLang interpreter*.

The supervisor runs this source with ``python -c`` in the server's interpreter and
environment (so this file's folder is never on ``sys.path``); it imports nothing but the
standard library and SGLang. ``scripts/gen_schema.py`` runs it by path.

* ``python schema_probe.py`` builds SGLang's own parser through
  ``ServerArgs.add_cli_args`` and prints every flag as JSON: dest, option strings, type,
  choices, default, nargs, help and, for booleans, which kind of switch it is:
  ``{"sglang_version": "...", "flags": [{...}, ...]}``.
* ``python schema_probe.py --validate`` reads a JSON argv list on stdin, runs SGLang's
  ``prepare_server_args(argv)`` (argparse: names, types, choices) and then
  ``check_server_args()`` on the unresolved record (the fallback when the managed GPUs'
  facts are unknown; ``resolve_probe.py`` runs the whole resolution otherwise), and prints
  ``{"ok": bool, "stage": "parse" | "check" | null, "message": str | null}``.
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


def validate(argv: list[str]) -> dict[str, Any]:
    import contextlib
    import io
    import logging

    from sglang.srt.server_args import prepare_server_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = prepare_server_args(argv)
    except SystemExit:
        # argparse printed usage and "prog: error: <message>" to stderr.
        lines = [ln for ln in err.getvalue().splitlines() if ": error: " in ln]
        message = lines[-1].split(": error: ", 1)[1] if lines else err.getvalue().strip()
        return {"ok": False, "stage": "parse", "message": message}
    except Exception as exc:
        return {"ok": False, "stage": "parse", "message": f"{type(exc).__name__}: {exc}"}
    logging.disable(logging.CRITICAL)
    # The checks read a few fields SGLang's resolution fills from the model path; fill
    # them the same trivial way (the rest of resolution needs the model files).
    for name in ("served_model_name", "tokenizer_path"):
        if getattr(args, name, "") is None:
            with contextlib.suppress(Exception):
                setattr(args, name, args.model_path)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            args.check_server_args()
    except AssertionError as exc:
        return {"ok": False, "stage": "check", "message": str(exc) or "assertion failed"}
    except ValueError as exc:
        return {"ok": False, "stage": "check", "message": str(exc)}
    except Exception as exc:
        # A check that needs what this host lacks (a GPU, the model files): not a verdict.
        return {"ok": True, "stage": None, "message": f"skipped: {type(exc).__name__}: {exc}"}
    return {"ok": True, "stage": None, "message": None}


def main() -> int:
    try:
        import sglang
        from sglang.srt.server_args import ServerArgs
    except Exception as exc:  # ImportError, or SGLang failing at import
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 3
    if sys.argv[1:] == ["--validate"]:
        argv = json.load(sys.stdin)
        json.dump(validate([str(a) for a in argv]), sys.stdout)
        return 0
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
