"""Which levers SGLang changes on a running server, and the path a lever change takes.

SGLang changes some of its launch flags on a running server: numeric scheduler knobs
(``POST /set_internal_state``, ``srt/managers/scheduler_components/internal_state.py``
``_update_handlers``), request logging (``POST /configure_logging``,
``ConfigureLoggingReq``), the hierarchical cache's storage backend (``PUT``/``DELETE
/hicache/storage-backend``), LoRA adapters (``/load_lora_adapter``,
``/unload_lora_adapter``) and the weights themselves (``POST /update_weights_from_disk``,
``UpdateWeightFromDiskReqInput``). Which flags each mechanism changes is read from the
installed SGLang's own source by the schema probe (``schema_probe.live_levers``), so a new
version's set is found the same way; the bundled 0.5.23 schema carries it for when the
live schema cannot be read.

``choose`` decides the path of a change from the serving set to a new one: ``live`` (every
changed lever is changed live, in ``steps``), ``weights`` (only what
``/update_weights_from_disk`` takes changed, ``model_path`` among them: the checkpoint is
checked next, ``sglang_supervisor.host.checkpoint_files``) or ``restart``, each with the
reason in words. Pure: nothing here talks to the server.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.sglang.schema import BUNDLED_VERSION, FlagSchema, load_bundled

#: The mechanisms a change made live goes through, in the order they are applied: the
#: one SGLang checks whole before it changes anything first (a refusal there leaves
#: nothing to put back), the ones that load files last.
LIVE_MECHANISMS = ("set_internal_state", "configure_logging", "hicache_storage", "lora")
WEIGHTS = "update_weights"
ENDPOINTS = {
    "set_internal_state": "POST /set_internal_state",
    "configure_logging": "POST /configure_logging",
    "hicache_storage": "PUT/DELETE /hicache/storage-backend",
    "lora": "POST /load_lora_adapter, /unload_lora_adapter",
    WEIGHTS: "POST /update_weights_from_disk",
}
PathKind = Literal["live", "weights", "restart"]
#: The schema ``LiveSet.of`` read last, and what it found.
_last: tuple[FlagSchema, LiveSet] | None = None


@dataclass(frozen=True)
class LiveSet:
    """The levers each mechanism changes (``{mechanism: {lever: request field}}``), where
    in SGLang's source that was read, and what was not found."""

    levers: Mapping[str, Mapping[str, str]]
    where: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    #: "the installed SGLang X" or "the bundled SGLang 0.5.23 schema".
    source: str = ""

    @classmethod
    def of(cls, schema: FlagSchema) -> LiveSet:
        """The schema's own live set; the bundled one where the schema has none and is
        the same SGLang version; else nothing is live (every change restarts). The last
        answer is kept: the schema is learned once."""
        global _last
        if _last is not None and _last[0] is schema:
            return _last[1]
        found = cls._read(schema)
        _last = (schema, found)
        return found

    @classmethod
    def _read(cls, schema: FlagSchema) -> LiveSet:
        data: Mapping[str, Any] = schema.live
        bundled = f"the bundled SGLang {BUNDLED_VERSION} schema"
        if schema.source == "bundled":
            source = bundled
        elif data:
            source = f"SGLang {schema.sglang_version}'s own source ({schema.source})"
        elif schema.sglang_version == BUNDLED_VERSION:
            data, source = load_bundled().live, f"{bundled} (the live one has no live levers)"
        else:
            source = f"none: SGLang {schema.sglang_version}'s schema has no live levers"
        levers = {
            m: dict((data.get(m) or {}).get("levers") or {})
            for m in (*LIVE_MECHANISMS, WEIGHTS)
            if isinstance(data.get(m), Mapping)
        }
        where = {m: str(data[m].get("where") or "") for m in levers}
        notes = tuple(str(n) for n in data.get("notes") or ())
        if not data:
            v = schema.sglang_version
            notes += (f"SGLang {v}: no live levers known; every change restarts",)
        return cls(levers, where, notes, source)

    def mechanism(self, lever: str) -> str | None:
        """The live mechanism that changes ``lever`` (not the weights update), or None."""
        for m in LIVE_MECHANISMS:
            if lever in self.levers.get(m, {}):
                return m
        return None

    def via(self, lever: str) -> str | None:
        """How SGLang changes ``lever`` on a running server (the endpoint), or None."""
        m = self.mechanism(lever)
        if m is None and lever in self.levers.get(WEIGHTS, {}):
            m = WEIGHTS
        return None if m is None else ENDPOINTS[m]

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "mechanisms": {
                m: {"endpoint": ENDPOINTS[m], "levers": sorted(lv), "where": self.where.get(m)}
                for m, lv in self.levers.items()
            },
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class LiveStep:
    """One mechanism's part of a live change: each lever's value now and the one to send."""

    mechanism: str
    old: Mapping[str, Any]
    new: Mapping[str, Any]

    def describe(self) -> str:
        changes = ", ".join(f"{k} {self.old.get(k)!r} -> {self.new.get(k)!r}" for k in self.new)
        return f"{ENDPOINTS[self.mechanism]}: {changes}"


@dataclass(frozen=True)
class ChangePath:
    """How a change reaches the server: live, by a weights update, or by a restart."""

    kind: PathKind
    reason: str
    steps: tuple[LiveStep, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"path": self.kind, "reason": self.reason}


def restart(reason: str) -> ChangePath:
    return ChangePath("restart", reason)


def choose(serving: LeverSet, new: LeverSet, live: LiveSet, schema: FlagSchema) -> ChangePath:
    """The path from ``serving`` (the ready server's levers) to ``new`` (checked, and
    different). A mix of live and restart levers is one restart."""
    env = sorted(k for k in set(serving.env) | set(new.env) if serving.env.get(k) != new.env.get(k))
    if env:
        return restart(f"the environment changes ({', '.join(env)}): only a new process reads it")
    old_lv, new_lv = serving.levers, new.levers
    changed = sorted(k for k in set(old_lv) | set(new_lv) if old_lv.get(k) != new_lv.get(k))
    weights = live.levers.get(WEIGHTS, {})
    if "model_path" in changed and all(k in weights for k in changed):
        return ChangePath(
            "weights",
            f"only {', '.join(changed)} changed: {ENDPOINTS[WEIGHTS]} loads the new weights "
            "into the running server",
        )
    by_mech: dict[str, list[str]] = {}
    fixed: list[str] = []
    for k in changed:
        m = live.mechanism(k)
        if m is None:
            fixed.append(k)
        else:
            by_mech.setdefault(m, []).append(k)
    if fixed:
        also = [k for names in by_mech.values() for k in names]
        tail = f" ({', '.join(also)} would change live, but one restart applies them all)"
        return restart(
            f"{', '.join(fixed)} {'needs' if len(fixed) == 1 else 'need'} a restart: SGLang "
            f"reads {'it' if len(fixed) == 1 else 'them'} only at launch{tail if also else ''}"
        )
    steps: list[LiveStep] = []
    for m in LIVE_MECHANISMS:
        if m not in by_mech:
            continue
        step = _step(m, by_mech[m], serving, new, schema)
        if isinstance(step, str):
            return restart(step)
        steps.append(step)
    return ChangePath(
        "live",
        f"only levers SGLang changes on a running server changed ({', '.join(changed)}): "
        + "; ".join(ENDPOINTS[s.mechanism] for s in steps),
        tuple(steps),
    )


def _value(levers: Mapping[str, Any], name: str, schema: FlagSchema) -> Any:
    """A lever's value, its schema default when the set leaves it out."""
    if name in levers:
        return levers[name]
    spec = schema.flags.get(name)
    return None if spec is None else spec.default


def _step(
    mechanism: str, names: list[str], serving: LeverSet, new: LeverSet, schema: FlagSchema
) -> LiveStep | str:
    """The step for ``names`` (all of ``mechanism``), or why it cannot be made live."""
    old = {k: _value(serving.levers, k, schema) for k in names}
    want = {k: _value(new.levers, k, schema) for k in names}
    if mechanism == "set_internal_state":
        for k, v in want.items():
            # SetInternalStateReq.server_args: Dict[str, Union[int, float]] (io_struct.py).
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                return (
                    f"{k} = {v!r}: {ENDPOINTS[mechanism]} takes a number, so SGLang's own "
                    "choice for an unset value is made only at launch; a restart"
                )
    elif mechanism == "configure_logging":
        for k, v in want.items():
            if v is None:  # ConfigureLoggingReq: None is "keep the current value"
                return (
                    f"{k} removed: {ENDPOINTS[mechanism]} reads an absent value as 'keep "
                    "the current one', so only a launch unsets it; a restart"
                )
    elif mechanism == "hicache_storage":
        why = _hicache_problem(serving, new, schema)
        if why is not None:
            return why
        # An attach sends the backend with its settings; a detach clears them together.
        old = {k: _value(serving.levers, k, schema) for k in _HICACHE}
        want = {k: _value(new.levers, k, schema) for k in _HICACHE}
    elif mechanism == "lora":
        why = _lora_problem(serving, new)
        if why is not None:
            return why
    return LiveStep(mechanism, old, want)


#: The hierarchical cache's storage levers: an attach sends them together.
_HICACHE = (
    "hicache_storage_backend",
    "hicache_storage_backend_extra_config",
    "hicache_storage_prefetch_policy",
    "hicache_write_policy",
)


def _hicache_problem(serving: LeverSet, new: LeverSet, schema: FlagSchema) -> str | None:
    lv = serving.levers
    if not lv.get("enable_hierarchical_cache"):
        return (
            "the hierarchical cache is off: SGLang attaches a storage backend only to a "
            "server started with enable_hierarchical_cache; a restart"
        )
    if not lv.get("admin_api_key"):
        # http_server.py attach/detach_hicache_storage_backend: _admin_api_key_missing_response.
        return (
            "SGLang changes the hierarchical cache's storage backend on a running server "
            "only when it was started with admin_api_key; a restart"
        )
    if _value(new.levers, "hicache_storage_backend", schema) is None:
        others = [
            k
            for k in _HICACHE[2:]
            if _value(serving.levers, k, schema) != _value(new.levers, k, schema)
        ]
        if others:
            return (
                f"{', '.join(others)} changed with no storage backend to attach: SGLang "
                "takes them live only with an attach; a restart"
            )
    return None


def _lora_problem(serving: LeverSet, new: LeverSet) -> str | None:
    lv = serving.levers
    if lv.get("enable_lora") is False or not (lv.get("enable_lora") or lv.get("lora_paths")):
        return (
            "LoRA is not enabled on the running server (tokenizer_control_mixin.py "
            "load_lora_adapter: 'LoRA is not enabled'); a restart"
        )
    if str(lv.get("dp_size") or 1) != "1":
        return "SGLang loads LoRA adapters live only with dp_size 1; a restart"
    try:
        lora_adapters(lv.get("lora_paths"))
        lora_adapters(new.levers.get("lora_paths"))
    except ValueError as exc:
        return f"lora_paths: {exc}; a restart"
    return None


@dataclass(frozen=True)
class Adapter:
    name: str
    path: str
    pinned: bool = False


def lora_adapters(value: Any) -> dict[str, Adapter]:
    """``lora_paths`` as SGLang 0.5.23 reads it (``srt/arg_groups/argparse_actions.py:8``
    ``LoRAPathAction``, ``srt/arg_groups/lora_hook.py:75-110``): each item ``name=path``,
    ``path`` (named after itself) or a JSON object with ``lora_name``, ``lora_path`` and
    ``pinned``. Raises ``ValueError`` for an item SGLang would refuse."""
    items = [] if value is None else value if isinstance(value, list) else [value]
    out: dict[str, Adapter] = {}
    for raw in items:
        item = raw.strip() if isinstance(raw, str) else raw
        if isinstance(item, str) and item.startswith("{") and item.endswith("}"):
            item = json.loads(item)
        if isinstance(item, dict):
            if "lora_name" not in item or "lora_path" not in item:
                raise ValueError(f"{raw!r} has no 'lora_name' and 'lora_path' keys")
            a = Adapter(str(item["lora_name"]), str(item["lora_path"]), bool(item.get("pinned")))
        elif isinstance(item, str):
            name, sep, path = item.partition("=")
            a = Adapter(name, path) if sep else Adapter(item, item)
        else:
            raise ValueError(f"{raw!r} is neither a string nor an object")
        out[a.name] = a
    return out
