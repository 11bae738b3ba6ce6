"""SGLang's own launch-time resolution of a lever set, asked in the server's interpreter.

``resolve_levers(python, argv, env, gpu_facts)`` runs ``supervisor/sglang/resolve_probe.py`` in
``python`` with exactly the environment and working directory the server would get:
SGLang's ``prepare_server_args`` (argparse), its resolution pipeline
(``ServerArgs.resolve_once``: every ``handle_*`` hook) and ``check_server_args``, with
the hardware facts it would read from CUDA answered from ``gpu_facts`` (NVML of the
managed GPUs, or the simulated ones). It returns a ``Verdict``: refused (SGLang's own
words and the file:line that raised them) or accepted with the values SGLang resolved
(the fraction it picks, chunk size, CUDA-graph batch sizes, page size, attention
backend...), and the checks that could not run here, each with why.

A warm helper (``sglang_supervisor.sglang.resolution_helper``) per (interpreter, environment,
working directory, GPU facts) keeps torch and SGLang imported and answers each request in a fork
of itself: ~0.1 s of work after the first (seconds) import. A request whose environment
differs from a warm helper's only in variables SGLang reads when it runs
(``resolution_helper.FORK_ENV_PREFIXES``, and none of them read while the helper
imported) is answered by that helper too, its fork taking on the request's environment;
any other difference starts a fresh helper (docs/validation.md says which variables, and
why). Everything here blocks: call it from a worker thread.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang_supervisor.sglang.parser import ParserUnavailable
from sglang_supervisor.sglang.resolution_helper import MAX_HELPERS, _Helper

#: Compute capability by GPU family, for when NVML's answer is not at hand.
_CAPABILITY_BY_NAME = (
    ("GB300", (10, 3)),
    ("B300", (10, 3)),
    ("GB200", (10, 0)),
    ("B200", (10, 0)),
    ("RTX PRO 6000", (12, 0)),
    ("RTX 50", (12, 0)),
    ("H200", (9, 0)),
    ("H100", (9, 0)),
    ("H800", (9, 0)),
    ("H20", (9, 0)),
    ("GH200", (9, 0)),
    ("L40", (8, 9)),
    ("L4", (8, 9)),
    ("RTX 40", (8, 9)),
    ("A100", (8, 0)),
    ("A800", (8, 0)),
    ("A30", (8, 0)),
    ("A10", (8, 6)),
    ("RTX 30", (8, 6)),
)


def capability_from_name(name: str) -> tuple[int, int] | None:
    """The compute capability of a GPU named ``name`` (NVML's name), if it is known."""
    upper = name.upper()
    for tag, cap in _CAPABILITY_BY_NAME:
        if tag in upper:
            return cap
    return None


@dataclass(frozen=True)
class GpuFacts:
    """What SGLang's resolution would read from CUDA, for the managed GPUs."""

    count: int
    name: str
    capability: tuple[int, int]
    #: Per GPU (the smallest of the managed ones), MiB as nvidia-smi reports it.
    memory_mib: int
    driver_version: str | None = None

    @classmethod
    def simulated(cls, count: int, memory_mib: int) -> GpuFacts:
        """The simulated backend's GPUs: H200s, SM 9.0."""
        return cls(count, "NVIDIA H200", (9, 0), memory_mib, "580.95.05")

    @classmethod
    def of_gpus(
        cls,
        names: Sequence[str],
        memory_total_bytes: Sequence[int],
        capability: tuple[int, int] | None = None,
        driver_version: str | None = None,
    ) -> GpuFacts | None:
        """Facts of the managed GPUs (NVML); None when their compute capability is
        unknown (then SGLang's hardware-dependent choices cannot be reproduced)."""
        if not names:
            return None
        cap = capability or capability_from_name(names[0])
        if cap is None:
            return None
        return cls(len(names), names[0], cap, min(memory_total_bytes) >> 20, driver_version)

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "name": self.name,
            "capability": list(self.capability),
            "memory_mib": self.memory_mib,
            "driver_version": self.driver_version,
        }


@dataclass(frozen=True)
class Verdict:
    """SGLang's answer for one argv."""

    ok: bool
    #: "parse" (argparse), "paths" (a path- or JSON-valued lever names nothing: see
    #: ``problems``), "resolve" (a resolution hook) or "check" (check_server_args).
    stage: str | None
    #: SGLang's own message when refused.
    message: str | None
    #: Where SGLang raised it: "sglang/srt/arg_groups/kv_cache_hook.py:394 in handle_...".
    where: str | None
    error_type: str | None
    #: Values SGLang resolved (empty when refused or when the model's config is absent).
    resolved: dict[str, Any] = field(default_factory=dict)
    #: Checks that did not run here: ``{"check": what, "reason": why}`` each.
    not_run: tuple[dict[str, str], ...] = ()
    #: Path- and JSON-valued levers that can never be read: ``{"lever", "message"}``.
    problems: tuple[dict[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    sglang_version: str | None = None
    duration_s: float = 0.0
    #: The names SGLang's raising statement and its conditions read, innermost frame
    #: first (``resolve_probe.code_names``): which levers its rule tested.
    code_names: tuple[tuple[str, ...], ...] = ()

    @classmethod
    def from_probe(cls, data: Mapping[str, Any], duration_s: float) -> Verdict:
        return cls(
            ok=bool(data["ok"]),
            stage=data.get("stage"),
            message=data.get("message"),
            where=data.get("where"),
            error_type=data.get("error_type"),
            resolved=dict(data.get("resolved") or {}),
            not_run=tuple(
                n if isinstance(n, dict) else {"check": str(n), "reason": ""}
                for n in data.get("not_run") or ()
            ),
            problems=tuple(data.get("problems") or ()),
            notes=tuple(data.get("notes") or ()),
            sglang_version=data.get("sglang_version"),
            duration_s=duration_s,
            code_names=tuple(
                tuple(str(n) for n in frame)
                for frame in data.get("code_names") or ()
                if isinstance(frame, list)
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "stage": self.stage,
            "message": self.message,
            "where": self.where,
            "resolved": self.resolved,
            "not_run": list(self.not_run),
            "notes": list(self.notes),
            "sglang_version": self.sglang_version,
            "duration_s": round(self.duration_s, 3),
        }


class ResolutionUnavailable(ParserUnavailable):
    """The SGLang in the interpreter lacks what its resolution needs (an entry point
    renamed by another version): only its parser and checks can answer."""

    def __init__(self, message: str, missing: Sequence[str]) -> None:
        super().__init__(message)
        self.missing = tuple(missing)


class Resolver:
    """Warm helpers, keyed by everything that makes the probe's answer differ."""

    def __init__(self, max_helpers: int = MAX_HELPERS) -> None:
        self._lock = threading.Lock()
        self._helpers: OrderedDict[str, _Helper] = OrderedDict()
        self._max = max_helpers
        #: Helper processes started so far (each imports SGLang: seconds).
        self.helpers_started = 0

    @staticmethod
    def _key(python: str, env: Mapping[str, str], cwd: str | None, gpu: GpuFacts) -> str:
        blob = json.dumps([python, sorted(env.items()), cwd, gpu.to_json()])
        return hashlib.sha256(blob.encode()).hexdigest()

    def _helper(
        self, python: str, env: Mapping[str, str], cwd: str | None, gpu: GpuFacts
    ) -> _Helper:
        key = self._key(python, env, cwd, gpu)
        with self._lock:
            helper = self._helpers.get(key)
            if helper is not None and helper.alive():
                self._helpers.move_to_end(key)
                return helper
            helper = _Helper(python, env, cwd, gpu)
            self.helpers_started += 1
            self._helpers[key] = helper
            while len(self._helpers) > self._max:
                _, old = self._helpers.popitem(last=False)
                old.close()
            return helper

    def _forkable(
        self, python: str, env: Mapping[str, str], cwd: str | None, gpu: GpuFacts, timeout_s: float
    ) -> _Helper | None:
        """A warm helper whose fork can answer for ``env`` (none with this exact
        environment yet): same interpreter, working directory and GPU facts, and an
        environment that differs only where ``_Helper.takes`` allows."""
        with self._lock:
            if self._key(python, env, cwd, gpu) in self._helpers:
                return None
            base = (python, cwd, json.dumps(gpu.to_json(), sort_keys=True))
            candidates = [h for h in reversed(self._helpers.values()) if h.base == base]
        for helper in candidates:
            with helper.lock:
                if helper.alive() and helper.takes(env, timeout_s):
                    return helper
        return None

    def warm(
        self, python: str, env: Mapping[str, str], gpu: GpuFacts, cwd: str | None = None
    ) -> None:
        """Start the helper for this environment now (its import takes seconds)."""
        self._helper(python, env, cwd, gpu)

    def resolve(
        self,
        python: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        gpu: GpuFacts,
        *,
        cwd: str | None = None,
        timeout_s: float = 120,
        paths: Mapping[str, str] | None = None,
    ) -> Verdict:
        t0 = time.monotonic()
        helper = self._forkable(python, env, cwd, gpu, timeout_s)
        if helper is None:
            helper = self._helper(python, env, cwd, gpu)
        with helper.lock:
            missing = helper.which_sglang(timeout_s).get("missing") or []
            if missing:
                raise ResolutionUnavailable(_missing_message(python, missing), missing)
            data = helper.ask(argv, timeout_s, env, paths)
        if "error" in data:
            raise ParserUnavailable(f"{python} could not run SGLang's resolution: {data['error']}")
        return Verdict.from_probe(data, time.monotonic() - t0)

    def which_sglang(
        self,
        python: str,
        env: Mapping[str, str],
        gpu: GpuFacts,
        cwd: str | None = None,
        timeout_s: float = 120,
    ) -> dict[str, Any]:
        """Which SGLang the helper for this environment imported: ``version``, ``path``
        and the ``missing`` entry points (``probe_serve.ENTRY_POINTS``). Blocks until
        it has imported SGLang (seconds). Raises ``ParserUnavailable``."""
        helper = self._helper(python, env, cwd, gpu)
        with helper.lock:
            return helper.which_sglang(timeout_s)

    def close(self) -> None:
        with self._lock:
            for helper in self._helpers.values():
                helper.close()
            self._helpers.clear()


def _missing_message(python: str, missing: Sequence[str]) -> str:
    return (
        f"the SGLang in {python} has no {', '.join(missing)} (renamed in another version?): "
        "its own resolution cannot run"
    )


_default: Resolver | None = None
_default_lock = threading.Lock()


def default_resolver() -> Resolver:
    """The process-wide resolver (created on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Resolver()
        return _default


def resolve_levers(
    python: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    gpu_facts: GpuFacts,
    *,
    cwd: str | None = None,
    timeout_s: float = 120,
    paths: Mapping[str, str] | None = None,
) -> Verdict:
    """SGLang's own verdict on ``argv`` as ``python -m sglang.launch_server`` would reach it.

    ``env`` and ``cwd`` are the server's (its ``PYTHONPATH`` and lever env included);
    ``gpu_facts`` are the managed GPUs'. The verdict's ``resolved`` holds the values
    SGLang picked (``mem_fraction_static``, ``chunked_prefill_size``, ``page_size``,
    ``attention_backend``, ``cuda_graph_max_bs``/``cuda_graph_bs``...); the planner uses
    them as its defaults where SGLang is installed. Raises ``ParserUnavailable`` when
    ``python`` cannot run SGLang at all. Blocks (seconds the first time per environment).
    ``paths`` (``sglang_supervisor.sglang.lever_paths.path_kinds``) are the path- and JSON-valued
    levers to check where the server runs before SGLang's resolution.
    """
    return default_resolver().resolve(
        python, argv, env, gpu_facts, cwd=cwd, timeout_s=timeout_s, paths=paths
    )
