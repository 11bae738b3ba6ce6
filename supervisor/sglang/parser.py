"""Asking the server's own interpreter about SGLang: its version, its flags, its verdict.

Operators run whichever SGLang they installed; flags change between versions. So the
schema is read from the configured interpreter, in the environment the server inherits
(``schema_probe.py`` run as ``-c`` source, through SGLang's ``ServerArgs.add_cli_args``),
cached per (interpreter, SGLang version). SGLang's full launch-time verdict on a lever set
is ``sglang_supervisor.sglang.resolution``; ``check_argv`` here is its parse-only fallback.
Everything here blocks (subprocesses): call it from a worker thread.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_supervisor.sglang.schema import BUNDLED_VERSION, FlagSchema, load_bundled
from sglang_supervisor.store import StoreError, atomic_write

log = logging.getLogger(__name__)

PROBE = Path(__file__).with_name("schema_probe.py")
_VERSION_SNIPPET = (
    "import importlib.metadata as m\n"
    "try:\n    print(m.version('sglang'))\n"
    "except m.PackageNotFoundError:\n    print('')\n"
)


class ParserUnavailable(RuntimeError):
    """The interpreter could not be run or answered nonsense; the message says which."""


def _run(python: str, args: list[str], stdin: str | None, timeout_s: float) -> str:
    """Run ``python`` in the environment the server inherits (its ``PYTHONPATH``
    included: an SGLang installed that way is found), never with ``-I``; the probes run
    as ``-c`` source so that their own directory is not on ``sys.path``."""
    try:
        out = subprocess.run(
            [python, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env={k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SUPERVISOR")},
        )
    except FileNotFoundError as exc:
        raise ParserUnavailable(
            f"server.python {python!r} does not exist; point it at the interpreter of the "
            "environment where SGLang is installed"
        ) from exc
    except OSError as exc:  # not executable, a directory...
        raise ParserUnavailable(
            f"server.python {python!r} cannot be run ({exc.strerror}); point it at the "
            "interpreter of the environment where SGLang is installed"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise ParserUnavailable(f"{python} did not answer within {timeout_s:.0f}s") from exc
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        raise ParserUnavailable(f"{python} failed (exit {out.returncode}): {' | '.join(tail)}")
    return out.stdout


def sglang_version(python: str, timeout_s: float = 30) -> str | None:
    """SGLang's version in ``python``'s environment, or None when it has no SGLang."""
    return _run(python, ["-c", _VERSION_SNIPPET], None, timeout_s).strip() or None


def read_schema(python: str, timeout_s: float = 180) -> FlagSchema:
    """Build SGLang's parser in ``python`` and describe every flag (a few seconds)."""
    text = _run(python, ["-c", PROBE.read_text()], None, timeout_s)
    try:
        data = json.loads(text)
        return FlagSchema.from_probe_output(data, source=python)
    except (ValueError, KeyError, TypeError) as exc:
        raise ParserUnavailable(f"{python} described SGLang's flags unreadably: {exc}") from exc


@dataclass(frozen=True)
class LoadedSchema:
    schema: FlagSchema
    #: Whether SGLang's own parser can be run for stage-two validation.
    live: bool
    #: Shown in /status when the bundled schema stands in for the live one.
    warning: str | None


def load_schema(python: str, cache_dir: Path) -> LoadedSchema:
    """The live schema of ``python``'s SGLang (cached), else the bundled one with a warning."""
    try:
        version = sglang_version(python)
    except ParserUnavailable as exc:
        return _bundled_instead(exc)
    if version is None:
        return LoadedSchema(
            load_bundled(),
            False,
            f"{python} has no SGLang installed: levers are checked against the bundled schema "
            f"of SGLang {BUNDLED_VERSION} only (set server.python to SGLang's interpreter to "
            "validate with its own parser)",
        )
    key = hashlib.sha256(os.path.realpath(python).encode()).hexdigest()[:12]
    cache = cache_dir / f"sglang-{version}-{key}.json"
    if cache.exists():
        try:
            data = json.loads(cache.read_text())
            if "live" not in data:  # cached by a daemon that did not read the live set
                raise KeyError("live")
            return LoadedSchema(FlagSchema.from_probe_output(data, source=python), True, None)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a damaged (or older) cache is rebuilt below
    try:
        schema = read_schema(python)  # SGLang installed but broken (a missing library...)
    except ParserUnavailable as exc:
        return _bundled_instead(exc)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(cache, json.dumps(schema.to_json()))
    except (OSError, StoreError) as exc:
        log.warning("cannot cache SGLang's flag schema in %s: %s", cache_dir, exc)
    return LoadedSchema(schema, True, None)


def _bundled_instead(exc: ParserUnavailable) -> LoadedSchema:
    return LoadedSchema(
        load_bundled(), False, f"{exc}; using the bundled schema of SGLang {BUNDLED_VERSION}"
    )


@dataclass(frozen=True)
class ParserVerdict:
    ok: bool
    #: "parse" (argparse refused), "check" (a cross-field check refused) or None.
    stage: str | None
    message: str | None
    duration_s: float


def check_argv(python: str, argv: list[str], timeout_s: float = 60) -> ParserVerdict:
    """Run SGLang's ``prepare_server_args(argv)`` and ``check_server_args()`` in ``python``."""
    t0 = time.monotonic()
    text = _run(python, ["-c", PROBE.read_text(), "--validate"], json.dumps(argv), timeout_s)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ParserUnavailable(f"{python} gave an unreadable verdict: {text[:200]!r}") from exc
    return ParserVerdict(
        bool(data["ok"]), data.get("stage"), data.get("message"), time.monotonic() - t0
    )


_OPTION = re.compile(r"(--[a-z0-9][a-z0-9-]*)")
_BARE_OPTION = re.compile(r"(?<![\w-])([a-z0-9]+(?:-[a-z0-9]+)+)(?![\w-])")


def levers_for_message(
    message: str,
    schema: FlagSchema,
    candidates: list[str],
    values: Mapping[str, Any] | None = None,
) -> list[str]:
    """Every lever an SGLang error message names (as ``--option``, as a bare
    ``option-name`` or as a dest), the request's own levers (``candidates``) first, in
    the order the message names them. When it names none, the request's levers it
    names in words ("Tokenizer worker num" -> tokenizer_worker_num) or by their value
    ("TRTLLM MLA backend" -> attention_backend = trtllm_mla, from ``values``)."""
    named = _named(message, schema, candidates)
    if any(d in candidates for d in named):
        return named
    words = re.sub(r"[^a-z0-9]+", "_", message.lower())
    found = [d for d in candidates if f"_{d}_" in f"_{words}_"]
    for dest, value in (values or {}).items():
        text = re.sub(r"[^a-z0-9]+", "_", str(value).lower()).strip("_")
        named_by_value = len(text) >= 3 and f"_{text}_" in f"_{words}_"
        if dest not in found and not isinstance(value, bool) and named_by_value:
            found.append(dest)
    return found + [d for d in named if d not in found]


#: Levers most of SGLang's rules read as context (the model, the TP width): a refusal is
#: named after them only when it names nothing more specific ("tp_size must be divisible
#: by attn_cp_size" is about attn_cp_size).
CONTEXT_LEVERS = ("model_path", "tp_size")


def refusal_levers(
    message: str,
    schema: FlagSchema,
    candidates: list[str],
    values: Mapping[str, Any] | None = None,
    code_names: Sequence[Sequence[str]] = (),
) -> list[str]:
    """The levers an SGLang refusal is about, the one to name first: the request's levers
    its message spells (as ``--option`` or dest, in its order), then those it names by
    value or in words that the code that raised it reads (``code_names``: the names the
    raising statement and its conditions read, innermost frame first, from the probe),
    the rest the message names, levers the message names beyond the request, the
    request's levers the code reads, and last the context levers (``CONTEXT_LEVERS``).
    Empty when nothing names a lever."""
    named = levers_for_message(message, schema, candidates, values)
    code: list[str] = []
    for frame in code_names:
        code += [n for n in frame if n in schema.flags and n not in code]
    mine = set(candidates)

    def specific(d: str) -> bool:
        return d in mine and d not in CONTEXT_LEVERS

    spelled = _named(message, schema, candidates)  # named as --option or dest, in order
    order = (
        [d for d in spelled if specific(d)]
        + [d for d in code if d in named and specific(d)]
        + [d for d in named if specific(d)]
        + [d for d in named if d not in mine]
        + [d for d in code if specific(d)]
        + [d for d in named + code if d in mine and d in CONTEXT_LEVERS]
    )
    return list(dict.fromkeys(order))


def _named(message: str, schema: FlagSchema, candidates: list[str]) -> list[str]:
    """Levers the message names, in the order it names them (the request's first)."""
    options = schema.by_option()
    first: dict[str, int] = {}
    for m in _OPTION.finditer(message):
        spec = options.get(m.group(1))
        if spec is not None:
            first.setdefault(spec.dest, m.start())
    for m in _BARE_OPTION.finditer(message):
        spec = options.get("--" + m.group(1))
        if spec is not None:
            first.setdefault(spec.dest, m.start())
    for dest in schema.flags:
        found = re.search(rf"(?<![\w-]){re.escape(dest)}(?![\w-])", message)
        if found is not None:
            first[dest] = min(first.get(dest, found.start()), found.start())
    named = sorted(first, key=first.__getitem__)
    mine = [d for d in named if d in candidates]
    return mine + [d for d in named if d not in candidates]


def lever_for_message(message: str, schema: FlagSchema, candidates: list[str]) -> str:
    """The lever an SGLang error message is about: the first option or dest it names.

    Prefers levers of the request (``candidates``); "levers" when none is named.
    """
    options = schema.by_option()
    named: list[str] = []
    for opt in _OPTION.findall(message):
        spec = options.get(opt)
        if spec is not None:
            named.append(spec.dest)
    for dest in schema.flags:
        if re.search(rf"\b{re.escape(dest)}\b", message):
            named.append(dest)
    for dest in named:
        if dest in candidates:
            return dest
    return named[0] if named else "levers"
