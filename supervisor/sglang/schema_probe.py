"""Ask the installed SGLang about its launch flags; runs *inside the SGLang interpreter*.

The supervisor runs this source with ``python -c`` in the server's interpreter and
environment (so this file's folder is never on ``sys.path``); it imports nothing but the
standard library and SGLang. ``scripts/gen_schema.py`` runs it by path.

* ``python schema_probe.py`` builds SGLang's own parser through
  ``ServerArgs.add_cli_args`` and prints every flag as JSON: dest, option strings, type,
  choices, default, nargs, help and, for booleans, which kind of switch it is:
  ``{"sglang_version": "...", "flags": [{...}, ...], "live": {...}}``. ``live`` is which
  flags SGLang can change on a running server, read from its own source (``live_levers``).
* ``python schema_probe.py --validate`` reads a JSON argv list on stdin, runs SGLang's
  ``prepare_server_args(argv)`` (argparse: names, types, choices) and then
  ``check_server_args()`` on the unresolved record (the fallback when the managed GPUs'
  facts are unknown; ``resolve_probe.py`` runs the whole resolution otherwise), and prints
  ``{"ok": bool, "stage": "parse" | "check" | null, "message": str | null}``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
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


#: Where SGLang changes a running server: (mechanism, the routes it needs, the file and the
#: request class (or method) whose fields (or keys) name what it changes). Read with
#: ``ast``, nothing imported: a version that renamed one leaves that mechanism out.
LIVE_SOURCES = (
    (
        "set_internal_state",
        (("POST", "/set_internal_state"),),
        "srt/managers/scheduler_components/internal_state.py",
        "SchedulerInternalStateController._update_handlers",
    ),
    (
        "configure_logging",
        (("POST", "/configure_logging"),),
        "srt/managers/io_struct.py",
        "ConfigureLoggingReq",
    ),
    (
        "hicache_storage",
        (("PUT", "/hicache/storage-backend"), ("DELETE", "/hicache/storage-backend")),
        "srt/managers/io_struct.py",
        "AttachHiCacheStorageReqInput",
    ),
    (
        "lora",
        (("POST", "/load_lora_adapter"), ("POST", "/unload_lora_adapter")),
        "srt/managers/io_struct.py",
        "LoadLoRAAdapterReqInput",
    ),
    (
        "update_weights",
        (("POST", "/update_weights_from_disk"), ("GET", "/model_info")),
        "srt/managers/io_struct.py",
        "UpdateWeightFromDiskReqInput",
    ),
)
_HTTP_SERVER = "srt/entrypoints/http_server.py"


def _routes(tree: ast.Module) -> set[tuple[str, str]]:
    """(method, path) of every ``@app.<method>(path)`` / ``@app.api_route(path, methods=[...])``."""
    found: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for dec in node.decorator_list:
            if not (isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute)):
                continue
            if not dec.args or not isinstance(dec.args[0], ast.Constant):
                continue
            path, verb = str(dec.args[0].value), dec.func.attr
            if verb in ("get", "post", "put", "delete"):
                found.add((verb.upper(), path))
            elif verb == "api_route":
                for kw in dec.keywords:
                    if kw.arg == "methods" and isinstance(kw.value, (ast.List, ast.Tuple)):
                        found |= {
                            (str(m.value).upper(), path)
                            for m in kw.value.elts
                            if isinstance(m, ast.Constant)
                        }
    return found


def _names(tree: ast.Module, where: str) -> tuple[list[str], int] | None:
    """The fields of class ``where`` (annotated names), or the string keys of the dict
    method ``Class.method`` returns, with the line it starts at."""
    cls_name, _, method = where.partition(".")
    for node in tree.body:
        if not (isinstance(node, ast.ClassDef) and node.name == cls_name):
            continue
        if not method:
            fields = [
                n.target.id
                for n in node.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            ]
            return fields, node.lineno
        for fn in node.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == method:
                for ret in ast.walk(fn):
                    if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict):
                        keys = [str(k.value) for k in ret.value.keys if isinstance(k, ast.Constant)]
                        return keys, fn.lineno
    return None


def _lever_for(field: str, flags: set[str]) -> str | None:
    """The launch flag a request field sets: the same name, the name less ``_json``
    (the hicache backend's JSON text), or the plural (``lora_path`` -> ``lora_paths``)."""
    for name in (field, field.removesuffix("_json"), field + "s"):
        if name in flags:
            return name
    return None


def live_levers(sglang_dir: str, flags: set[str]) -> dict[str, Any]:
    """Which launch flags SGLang changes on a running server, read from its own source:
    ``{mechanism: {"levers": {flag: field}, "where": "srt/...py:LINE"}, "notes": [...]}``."""
    out: dict[str, Any] = {"notes": []}
    try:
        with open(os.path.join(sglang_dir, _HTTP_SERVER), encoding="utf-8") as f:
            routes = _routes(ast.parse(f.read()))
    except (OSError, SyntaxError) as exc:
        out["notes"].append(f"{_HTTP_SERVER} unreadable ({exc}): nothing is changed live")
        return out
    trees: dict[str, ast.Module] = {}
    for mechanism, needs, rel, where in LIVE_SOURCES:
        missing = [f"{m} {p}" for m, p in needs if (m, p) not in routes]
        if missing:
            out["notes"].append(f"{mechanism}: no {', '.join(missing)} in {_HTTP_SERVER}")
            continue
        try:
            if rel not in trees:
                with open(os.path.join(sglang_dir, rel), encoding="utf-8") as f:
                    trees[rel] = ast.parse(f.read())
            found = _names(trees[rel], where)
        except (OSError, SyntaxError) as exc:
            out["notes"].append(f"{mechanism}: {rel} unreadable ({exc})")
            continue
        if found is None:
            out["notes"].append(f"{mechanism}: no {where} in {rel}")
            continue
        names, line = found
        levers = {lever: n for n in names if (lever := _lever_for(n, flags)) is not None}
        out[mechanism] = {"levers": levers, "where": f"{rel}:{line}"}
    return out


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
    flags = describe(parser)
    live = live_levers(os.path.dirname(sglang.__file__), {f["dest"] for f in flags})
    json.dump({"sglang_version": version, "flags": flags, "live": live}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
