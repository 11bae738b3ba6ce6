"""Which SGLang answers validation, and how much of what the daemon knows is its own.

The schema, the parser, the resolution pipeline and the checks are asked of the SGLang in
``server.python`` (whatever version it is). The planner's formulas, the lever range
tables and the bundled schema are SGLang ``BUNDLED_VERSION``'s own knowledge: with
another SGLang they may be out of date. Validation is ``full`` when SGLang's own
resolution runs, ``degraded`` (with the reason) when only part of it can (its resolution
entry point renamed, unknown GPUs, no SGLang at all), ``checking`` while its resolution
helper still imports it. /status, the status page and the plan all show this.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sglang_supervisor.sglang.schema import BUNDLED_VERSION

FULL = "full"
DEGRADED = "degraded"
CHECKING = "checking"


@dataclass(frozen=True)
class SglangInfo:
    """What /status says under ``sglang``."""

    version: str | None
    #: Where its package is (None until its resolution helper said, or without SGLang).
    path: str | None
    #: ``full``, ``degraded`` or ``checking``.
    validation: str
    #: Why validation is degraded, or what differs from the daemon's own knowledge.
    reason: str | None
    #: SGLang's entry points the resolution needs that this SGLang lacks.
    missing: tuple[str, ...] = ()
    #: The SGLang version the planner's formulas and range tables come from.
    knowledge_from: str = BUNDLED_VERSION

    @property
    def resolution_runs(self) -> bool:
        return self.validation != DEGRADED

    @property
    def other_version(self) -> bool:
        return self.version is not None and self.version != self.knowledge_from

    def knowledge_note(self) -> str | None:
        """A line saying which parts are the bundled version's knowledge, for another SGLang."""
        if not self.other_version:
            return None
        return (
            f"SGLang {self.version} in server.python answers validation (its parser, "
            f"resolution and checks), but the planner's formulas, the lever range tables "
            f"and the bundled schema are SGLang {self.knowledge_from}'s own knowledge: "
            "plans and range checks may not match this version"
        )

    def degraded(self, reason: str) -> SglangInfo:
        return replace(self, validation=DEGRADED, reason=reason)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "path": self.path,
            "validation": self.validation,
            "reason": self.reason,
            "missing": list(self.missing),
            "knowledge_from": self.knowledge_from,
        }


def before_start() -> SglangInfo:
    """Nothing known yet (start-up has not read server.python)."""
    return SglangInfo(None, None, CHECKING, "start-up has not read server.python yet")


def after_schema(
    version: str | None, live: bool, warning: str | None, gpus_known: bool
) -> SglangInfo:
    """What start-up knows once it has read the flag schema from server.python."""
    if not live:
        # The schema loader's warning already says the bundled schema is used (one owner:
        # sglang.parser.load_schema); saying it again doubled the clause on the page.
        return SglangInfo(
            None,
            None,
            DEGRADED,
            warning
            or "server.python has no usable SGLang; levers are checked against the bundled "
            f"schema of SGLang {BUNDLED_VERSION} only",
        )
    if not gpus_known:
        return SglangInfo(
            version,
            None,
            DEGRADED,
            "the managed GPUs' compute capability is unknown: SGLang's parser and "
            "check_server_args run, not its resolution (whose choices depend on the GPU)",
        )
    return SglangInfo(version, None, CHECKING, "SGLang's resolution helper is importing it")


def after_helper(info: SglangInfo, said: dict[str, Any]) -> SglangInfo:
    """What the resolution helper said about the SGLang it imported (its READY line)."""
    version = said.get("version") or info.version
    path = said.get("path")
    missing = tuple(str(m) for m in said.get("missing") or ())
    if missing:
        return SglangInfo(
            version,
            path,
            DEGRADED,
            f"SGLang {version} at {path} has no {', '.join(missing)} (renamed in another "
            "version?): its own resolution cannot run; levers are checked against its flag "
            "schema and, where it has them, its parser and check_server_args only. "
            "Install SGLang "
            f"{info.knowledge_from} in server.python, or a supervisor that knows {version}",
            missing,
        )
    done = SglangInfo(version, path, FULL, None)
    return replace(done, reason=done.knowledge_note())
