"""Each live mechanism's calls to the running server: set a lever's value there, read it
back, and put the old one back (``LiveServer``), through SGLang's runtime endpoints
(``sglang_supervisor.sglang.control``).

What each read-back proves: ``/set_internal_state``'s values appear in ``/server_info``'s
``internal_states`` (SGLang resolves them from the same context override) on every DP
worker; the storage backend in ``GET /hicache/storage-backend``; the LoRA adapters in the
``loaded_adapters`` SGLang answers; ``/configure_logging`` has no read-back — its own
``Config logging: obj=ConfigureLoggingReq(...)`` line in the server's log (written at
INFO) is the confirmation, and where the new log level hides it, the detail says so.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sglang_supervisor.engine.parts import Parts
from sglang_supervisor.host.backend import ServerHandle
from sglang_supervisor.sglang.auth import ServerKeys
from sglang_supervisor.sglang.control import Answer
from sglang_supervisor.sglang.levers import LeverSet
from sglang_supervisor.sglang.live import ENDPOINTS, LiveSet, lora_adapters

#: How long SGLang's confirmation may take to reach its log.
LOG_CONFIRM_S = 2.0
_QUIET_LEVELS = ("warning", "error", "critical")


class LiveFailed(RuntimeError):
    """SGLang refused a live change, or did not read it back (its words included)."""


def _log_size(path: Path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _log_since(path: Path, offset: int) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(4 << 20).decode(errors="replace").splitlines()
    except OSError:
        return []


class LiveServer:
    """The ready server, asked through its runtime endpoints (one operation's calls)."""

    def __init__(self, parts: Parts, handle: ServerHandle, serving: LeverSet) -> None:
        self.parts, self.handle = parts, handle
        self.url = parts.url
        self.keys = ServerKeys.of(serving.levers)
        t = parts.settings.timeouts
        self.timeout_s = t.liveness_timeout_s
        self.load_timeout_s = t.ready_timeout_s
        self.live = LiveSet.of(parts.schema)
        #: The adapters the server holds, as it last said.
        self.adapters: dict[str, str] = {
            n: a.path for n, a in lora_adapters(serving.levers.get("lora_paths")).items()
        }

    async def read(self, path: str) -> Mapping[str, Any]:
        ans = await self.parts.control.read(
            self.url, path, keys=self.keys, timeout_s=self.timeout_s
        )
        if not ans.ok:
            raise LiveFailed(f"GET {path} answered {ans.status}: {ans.detail}")
        data: Mapping[str, Any] = ans.body
        return data

    async def set(self, mechanism: str, values: Mapping[str, Any]) -> str:
        """Set ``values`` (lever -> value) through ``mechanism``; returns what SGLang said.
        Raises ``LiveFailed`` (or ``ControlError``: the server does not answer)."""
        c, url, keys, t = self.parts.control, self.url, self.keys, self.timeout_s
        if mechanism == "set_internal_state":
            offset = await asyncio.to_thread(_log_size, self.handle.log_path)
            ans = await c.set_internal_state(url, values, keys=keys, timeout_s=t)
            if not ans.ok:
                raise LiveFailed(await self._refused(ans, offset, "Updating "))
            return f"updated on {len(ans.body)} DP worker(s)"
        if mechanism == "configure_logging":
            ans = await c.configure_logging(url, values, keys=keys, timeout_s=t)
            if not ans.ok:
                raise LiveFailed(f"{ENDPOINTS[mechanism]} answered {ans.status}: {ans.detail}")
            return "answered 200"
        if mechanism == "hicache_storage":
            return await self._set_hicache(values)
        return await self._set_lora(values)

    async def _refused(self, ans: Answer, offset: int, marker: str) -> str:
        """SGLang's refusal, with the reason its log gives (the answer has none)."""
        lines = await asyncio.to_thread(_log_since, self.handle.log_path, offset)
        said = [ln.split("] ", 1)[-1] for ln in lines if marker in ln]
        why = f": {said[-1]}" if said else f" ({ans.detail or 'no reason given'})"
        return f"SGLang refused {ENDPOINTS['set_internal_state']} (answered {ans.body}){why}"

    async def _set_hicache(self, values: Mapping[str, Any]) -> str:
        c, url, keys, t = self.parts.control, self.url, self.keys, self.timeout_s
        # A detach first (SGLang refuses a second attach; a detach of none succeeds).
        ans = await c.detach_hicache(url, keys=keys, timeout_s=t)
        if not ans.ok:
            raise LiveFailed(f"SGLang refused DELETE /hicache/storage-backend: {ans.detail}")
        backend = values.get("hicache_storage_backend")
        if backend is None:
            return "storage backend detached"
        fields = self.live.levers.get("hicache_storage", {})
        body = {fields.get(k, k): v for k, v in values.items() if v is not None}
        ans = await c.attach_hicache(url, body, keys=keys, timeout_s=t)
        if not ans.ok:
            raise LiveFailed(f"SGLang refused PUT /hicache/storage-backend: {ans.detail}")
        return f"storage backend {backend!r} attached"

    async def _set_lora(self, values: Mapping[str, Any]) -> str:
        c, url, keys, t = self.parts.control, self.url, self.keys, self.load_timeout_s
        want = lora_adapters(values.get("lora_paths"))
        done: list[str] = []
        for name in [
            n for n, p in self.adapters.items() if want.get(n, None) is None or want[n].path != p
        ]:
            ans = await c.lora(url, "unload", {"lora_name": name}, keys=keys, timeout_s=t)
            if not ans.ok:
                raise LiveFailed(f"SGLang refused to unload LoRA adapter {name!r}: {ans.detail}")
            self.adapters.pop(name, None)
            done.append(f"unloaded {name}")
        for name, a in want.items():
            if name in self.adapters:
                continue
            body = {"lora_name": name, "lora_path": a.path, "pinned": a.pinned}
            ans = await c.lora(url, "load", body, keys=keys, timeout_s=t)
            if not ans.ok:
                raise LiveFailed(f"SGLang refused to load LoRA adapter {name!r}: {ans.detail}")
            loaded = ans.body.get("loaded_adapters") if isinstance(ans.body, dict) else None
            self.adapters = {str(k): str(v) for k, v in (loaded or {name: a.path}).items()}
            done.append(f"loaded {name}")
        return ", ".join(done) or "adapters unchanged"

    async def check(self, mechanism: str, values: Mapping[str, Any], offset: int) -> str:
        """Read ``values`` back from the server; the sentence says how. Raises
        ``LiveFailed`` when it holds something else."""
        if mechanism == "set_internal_state":
            states = (await self.read("/server_info")).get("internal_states") or []
            if not states:
                raise LiveFailed("/server_info has no internal_states to read the values back")
            for i, state in enumerate(states):
                for k, v in values.items():
                    got = state.get(k) if isinstance(state, dict) else None
                    if not isinstance(got, (int, float)) or not math.isclose(got, v):
                        raise LiveFailed(
                            f"/server_info internal_states[{i}] reads {k} = {got!r}, not {v!r}"
                        )
            return f"/server_info reads {dict(values)} on {len(states)} DP worker(s)"
        if mechanism == "configure_logging":
            return await self._confirm_logging(values, offset)
        if mechanism == "hicache_storage":
            ans = await self.parts.control.hicache_backend(
                self.url, keys=self.keys, timeout_s=self.timeout_s
            )
            if not ans.ok:
                raise LiveFailed(
                    f"GET /hicache/storage-backend answered {ans.status}: {ans.detail}"
                )
            wrong = {
                k: ans.body.get(k)
                for k, v in values.items()
                if v is not None and ans.body.get(k) != v
            }
            if wrong or ans.body.get("hicache_storage_backend") != values.get(
                "hicache_storage_backend"
            ):
                raise LiveFailed(
                    f"GET /hicache/storage-backend reads {ans.body}, not {dict(values)}"
                )
            backend = ans.body.get("hicache_storage_backend")
            return f"GET /hicache/storage-backend reads backend {backend!r}"
        want = set(lora_adapters(values.get("lora_paths")))
        if set(self.adapters) != want:
            raise LiveFailed(
                f"SGLang holds LoRA adapters {sorted(self.adapters)}, not {sorted(want)}"
            )
        return f"SGLang holds LoRA adapters {sorted(want)}"

    async def _confirm_logging(self, values: Mapping[str, Any], offset: int) -> str:
        level = str(values.get("log_level") or "").lower()
        if level in _QUIET_LEVELS:
            return (
                f"not verifiable: /configure_logging answers no read-back, and SGLang logs its "
                f"confirmation at INFO, which log_level {level} hides"
            )
        wanted = [f"{k}={v!r}" for k, v in values.items()]
        deadline = self.parts.clock() + LOG_CONFIRM_S
        while True:
            lines = await asyncio.to_thread(_log_since, self.handle.log_path, offset)
            for ln in lines:
                if "Config logging: obj=ConfigureLoggingReq(" in ln and all(
                    w in ln for w in wanted
                ):
                    return f"the server's log confirms {', '.join(wanted)} (no read-back exists)"
            if self.parts.clock() >= deadline:
                return (
                    "not confirmed: SGLang answered 200, but its 'Config logging' line did not "
                    f"appear in its log within {LOG_CONFIRM_S:g}s (no read-back exists)"
                )
            await asyncio.sleep(0.05)

    async def log_offset(self) -> int:
        return await asyncio.to_thread(_log_size, self.handle.log_path)
