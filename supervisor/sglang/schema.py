"""The flag schema of SGLang: every launch flag's dest, option strings, type and choices.

The bundled schema (``supervisor/data/sglang-<version>.json``) is generated from the real
SGLang parser by ``scripts/gen_schema.py``; it is what the simulated server accepts and
what first-line validation checks names, types and choices against.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

BUNDLED_VERSION = "0.5.23"


def normalize_name(name: str) -> str:
    """``--mem-fraction-static`` / ``mem-fraction-static`` -> ``mem_fraction_static``."""
    return name.strip().lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class FlagSpec:
    dest: str
    option_strings: tuple[str, ...]
    #: "str", "int", "float", or "callable:<name>" for SGLang's own parsers.
    type: str
    #: "store_true", "store_false", "boolean_optional", "flag" (other zero-arg action) or None.
    boolean: str | None
    choices: tuple[Any, ...] | None
    default: Any
    nargs: str | int | None
    help: str
    deprecated: bool

    @property
    def option(self) -> str:
        """The canonical long option (``--mem-fraction-static``)."""
        longs = [o for o in self.option_strings if o.startswith("--")]
        return longs[0] if longs else self.option_strings[0]

    @property
    def takes_list(self) -> bool:
        return self.nargs in ("+", "*") or (isinstance(self.nargs, int) and self.nargs > 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "dest": self.dest,
            "option_strings": list(self.option_strings),
            "type": self.type,
            "boolean": self.boolean,
            "choices": None if self.choices is None else list(self.choices),
            "default": self.default,
            "nargs": self.nargs,
            "help": self.help,
            "deprecated": self.deprecated,
        }


@dataclass(frozen=True)
class FlagSchema:
    sglang_version: str
    #: One spec per dest. Where several actions share a dest (a deprecated spelling
    #: beside the real flag) the non-deprecated one wins.
    flags: dict[str, FlagSpec]
    #: Where the schema came from: "bundled", or the interpreter it was read from.
    source: str = "bundled"
    #: Which flags SGLang changes on a running server, as the probe read them from its
    #: source (``schema_probe.live_levers``; ``sglang_supervisor.sglang.live`` reads it).
    live: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_probe_output(cls, data: dict[str, Any], source: str) -> FlagSchema:
        flags: dict[str, FlagSpec] = {}
        for raw in data["flags"]:
            spec = FlagSpec(
                dest=raw["dest"],
                option_strings=tuple(raw["option_strings"]),
                type=raw["type"],
                boolean=raw["boolean"],
                choices=None if raw["choices"] is None else tuple(raw["choices"]),
                default=raw["default"],
                nargs=raw["nargs"],
                help=raw["help"],
                deprecated=bool(raw["deprecated"]),
            )
            old = flags.get(spec.dest)
            if old is None or (old.deprecated and not spec.deprecated):
                flags[spec.dest] = spec
        live = data.get("live")
        return cls(
            sglang_version=str(data["sglang_version"]),
            flags=flags,
            source=source,
            live=dict(live) if isinstance(live, dict) else {},
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "sglang_version": self.sglang_version,
            "source": self.source,
            "flags": [f.to_json() for f in self.flags.values()],
            "live": dict(self.live),
        }

    @functools.cached_property
    def _options(self) -> dict[str, FlagSpec]:
        out: dict[str, FlagSpec] = {}
        for spec in self.flags.values():
            for opt in spec.option_strings:
                out.setdefault(opt, spec)
        return out

    @functools.cached_property
    def _names(self) -> dict[str, FlagSpec]:
        named = {normalize_name(opt): spec for opt, spec in self._options.items()}
        return {**named, **self.flags}  # a dest wins over an alias spelled the same

    def by_option(self) -> dict[str, FlagSpec]:
        """Every option string (``--tp``, ``--tp-size``) -> its spec."""
        return self._options

    def find(self, name: str) -> FlagSpec | None:
        """The flag a lever name means: its dest or an exact option alias, in either
        spelling (``tensor-parallel-size`` -> tp_size). Never a prefix."""
        return self._names.get(normalize_name(name))

    def search(self, word: str | None) -> list[FlagSpec]:
        """Flags whose dest, option or help mentions ``word`` (all flags when None)."""
        if not word:
            return sorted(self.flags.values(), key=lambda f: f.dest)
        w = word.lower().replace("-", "_")
        hits = [
            f
            for f in self.flags.values()
            if w in f.dest
            or any(w in o.replace("-", "_") for o in f.option_strings)
            or word.lower() in f.help.lower()
        ]
        return sorted(hits, key=lambda f: (w not in f.dest, f.dest))


def load_bundled(version: str = BUNDLED_VERSION) -> FlagSchema:
    """The schema shipped with the package for SGLang ``version``."""
    text = resources.files("sglang_supervisor").joinpath(f"data/sglang-{version}.json").read_text()
    return FlagSchema.from_probe_output(json.loads(text), source="bundled")
