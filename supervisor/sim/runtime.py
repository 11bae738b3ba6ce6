"""The simulated server's runtime endpoints, as SGLang 0.5.23 answers them: what it changes
on a running server and new weights without a reload, with SGLang's own checks.

* ``POST /set_internal_state`` — ``{"server_args": {...}}``; each key must have a handler
  (``internal_state.py`` ``_update_handlers``: ``pp_max_micro_batch_size`` in ``[1,
  max_running_requests // pp_size]``, the speculative accept thresholds; the DSpark keys need
  a DSpark draft worker), all are checked before any applies; the answer is one
  ``updated`` per DP worker, and ``/server_info``'s ``internal_states`` read the overrides
  back;
* ``POST /configure_logging`` — request logging and the log level, an empty 200, and
  ``Config logging: obj=ConfigureLoggingReq(...)`` in the log (at INFO);
* ``GET``/``PUT``/``DELETE /hicache/storage-backend`` — only with an ``admin_api_key`` and the
  hierarchical cache on, and only while no request runs or waits;
* ``POST /load_lora_adapter``, ``/unload_lora_adapter`` — only with LoRA enabled;
* ``POST /update_weights_from_disk`` — waits for the requests in flight, holds new ones
  (SGLang's ``model_update_lock``), loads for the new weights' size at
  ``SGLANG_SIM_WEIGHT_LOAD_GBPS`` (8 GB/s); the fault ``update_weights_fail=N`` fails the
  first N updates as SGLang fails one mid-load: its own recovery reloads from the path it
  was given, so the weights in memory are the new path's while ``/model_info`` still names
  the old one. What the weights in memory are shows in every answer: each generated token
  is the checkpoint directory's name (``sim`` for the built-in model).

A LoRA adapter loads from a local directory only (a hub id that cannot be downloaded
fails the same way in SGLang).

Auth as SGLang's ``ADMIN_OPTIONAL`` endpoints: the admin key when one is set, else the API
key when one is set, else none (``srt/utils/auth.py`` ``decide_request_auth``).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sglang_supervisor.planner.checkpoint import weight_bytes_from_dir
from sglang_supervisor.sglang import auth as auth_rule
from sglang_supervisor.sglang.auth import ServerKeys
from sglang_supervisor.sglang.live import lora_adapters
from sglang_supervisor.sim.flags import ServerConfig, log

Answer = tuple[int, str, bytes]
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
LOAD_RATE_ENV = "SGLANG_SIM_WEIGHT_LOAD_GBPS"
LOGGING_FIELDS = (
    "log_requests",
    "log_requests_level",
    "log_requests_format",
    "log_level",
    "dump_requests_folder",
    "dump_requests_threshold",
    "crash_dump_folder",
    "dump_requests_exclude_meta_keys",
)
HICACHE_FIELDS = (
    "hicache_storage_backend",
    "hicache_storage_backend_extra_config",
    "hicache_storage_prefetch_policy",
    "hicache_write_policy",
)
_ADMIN_MISSING = (
    "This endpoint requires admin API key, but this server was started without one "
    "(admin-api-key). Restart with --admin-api-key to enable."
)
_THRESHOLDS = ("speculative_accept_threshold_single", "speculative_accept_threshold_acc")
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


def _json(status: int, data: Any) -> Answer:
    return status, JSON, json.dumps(data).encode()


class ModelLock:
    """SGLang's ``model_update_lock`` (``srt/utils/aio_rwlock.py``), in threads: requests
    share it; a weights update waits until none runs and holds new ones meanwhile."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._waiting = 0

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writing and self._waiting == 0)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not self._writing and self._readers == 0)
            self._waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


class Runtime:
    """What a running simulated server changes without a restart."""

    def __init__(
        self,
        cfg: ServerConfig,
        *,
        workers: int,
        max_running: int,
        inflight: Callable[[], int],
        update_faults: int = 0,
    ) -> None:
        a = cfg.args
        self.args = a
        self.workers, self.max_running, self._inflight = workers, max_running, inflight
        #: set_internal_state's overrides (SGLang's context override "update_server_args").
        self.overrides: dict[str, Any] = {}
        self.logging: dict[str, Any] = {k: a.get(k) for k in LOGGING_FIELDS if k in a}
        self.level = _LEVELS.get(str(a.get("log_level") or "info").lower(), 20)
        self.model_path = cfg.model_path
        self.served_model_name = cfg.served_model_name
        self.weight_version = str(a.get("weight_version") or "default")
        self.load_format = str(a.get("load_format") or "auto")
        #: The weights in memory (SGLang's recovery after a failed update may differ).
        self.weights_path = cfg.model_path
        self.hicache = {k: a.get(k) for k in HICACHE_FIELDS}
        self.loras = {n: ad.path for n, ad in lora_adapters(a.get("lora_paths")).items()}
        self.model_lock = ModelLock()
        self._update_faults = update_faults
        self._lock = threading.Lock()

    # ------------------------------------------------------------ what others read

    def internal_state(self) -> dict[str, Any]:
        """The live knobs as ``/server_info``'s ``internal_states`` read them back."""
        keys = ("pp_max_micro_batch_size", *_THRESHOLDS)
        return {k: self.overrides.get(k, self.args.get(k)) for k in keys}

    def piece(self) -> str:
        """What the weights in memory answer: ``sim``, or a checkpoint directory's name, so
        a client sees whose weights serve (after a failed update, the new path's)."""
        path = Path(self.weights_path).expanduser()
        return path.name if path.is_dir() else "sim"

    def log_request(self, text: str) -> None:
        """SGLang's request logger, on when ``log_requests`` is (request_logger.py)."""
        if self.logging.get("log_requests"):
            if self.logging.get("log_requests_format") == "json":
                log(json.dumps({"event": "request.received", "obj": {"text": text[:2048]}}))
            else:
                log(f"Receive: obj=GenerateReqInput(text={text[:2048]!r})")

    # ------------------------------------------------------------------ dispatch

    def handle(self, method: str, path: str, body: bytes, auth: str | None) -> Answer | None:
        """The answer to a runtime endpoint, or None when ``path`` is not one."""
        routes: dict[tuple[str, str], Callable[[dict[str, Any]], Answer]] = {
            ("POST", "/set_internal_state"): self._set_internal_state,
            ("PUT", "/set_internal_state"): self._set_internal_state,
            ("POST", "/configure_logging"): self._configure_logging,
            ("GET", "/hicache/storage-backend"): self._hicache_status,
            ("PUT", "/hicache/storage-backend"): self._attach,
            ("DELETE", "/hicache/storage-backend"): self._detach,
            ("POST", "/load_lora_adapter"): self._load_lora,
            ("POST", "/unload_lora_adapter"): self._unload_lora,
            ("POST", "/update_weights_from_disk"): self._update_weights,
        }
        handler = routes.get((method, path))
        if handler is None:
            return None
        if not self.authorized(method, path, auth):
            return _json(401, {"error": "Unauthorized"})
        try:
            data = json.loads(body or b"{}")
        except ValueError as exc:
            return _json(422, {"detail": f"JSON decode error: {exc}"})
        if not isinstance(data, dict):
            return _json(422, {"detail": "the body must be a JSON object"})
        with self._lock:  # one control call at a time, as SGLang's one event loop
            return handler(data)

    def authorized(self, method: str, path: str, authorization: str | None) -> bool:
        """SGLang's verdict on a request to ``path`` (``sglang.auth``: which key where)."""
        return auth_rule.allowed(ServerKeys.of(self.args), method, path, authorization)

    # ------------------------------------------------------------- internal state

    def _set_internal_state(self, data: dict[str, Any]) -> Answer:
        requested = data.get("server_args")
        if not isinstance(requested, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in requested.values()
        ):
            return _json(422, {"detail": "server_args: Dict[str, Union[int, float]] expected"})
        for key, value in requested.items():
            why = self._rejected(key, value)
            if why is not None:
                log(f"WARNING: {why}")
                return _json(200, [False] * self.workers)
        self.overrides.update(requested)
        log(f"Config updated via context override: {requested}")
        return _json(200, [True] * self.workers)

    def _rejected(self, key: str, value: float) -> str | None:
        if key == "pp_max_micro_batch_size":
            upper = self.max_running // max(1, int(self.args.get("pp_size") or 1))
            if value < 1 or value > upper:
                return (
                    f"Updating {key} to {value} is rejected because it is out of the "
                    f"valid range [1, {upper}]."
                )
            return None
        if key in _THRESHOLDS:
            return None  # no DFlash sampling-mask requests here
        if key in ("dspark_force_budget_frac", "dspark_clear_info_records"):
            return f"{key} requires a DSpark draft worker."
        return f"Updating {key} is not supported."

    # ------------------------------------------------------------------ logging

    def _configure_logging(self, data: dict[str, Any]) -> Answer:
        given = {k: data.get(k) for k in LOGGING_FIELDS}
        level = given.get("log_level")
        if level is not None:
            if str(level).lower() not in _LEVELS:  # setLevel raises: a 500
                return 500, TEXT, b"Internal Server Error"
            self.level = _LEVELS[str(level).lower()]
        self.logging.update({k: v for k, v in given.items() if v is not None})
        if self.level <= _LEVELS["info"]:
            fields = ", ".join(f"{k}={v!r}" for k, v in given.items())
            log(
                f"Config logging: obj=ConfigureLoggingReq(rid=None, http_worker_ipc=None, {fields})"
            )
        return 200, TEXT, b""

    # -------------------------------------------------------------- hicache

    def _hicache_check(self, what: str) -> Answer | None:
        if not self.args.get("admin_api_key"):
            return _json(400, {"error": _ADMIN_MISSING})
        if not self.args.get("enable_hierarchical_cache"):
            return 400, TEXT, f"{what}\nHierarchical cache is not enabled.\n".encode()
        left = self._inflight()
        if left:
            verb = "attach" if "attach" in what else "detach"
            why = f"Reject {verb}: scheduler is not idle. #queue-req=? #running-req={left}"
            return 400, TEXT, f"{what}\n{why}\n".encode()
        return None

    def _hicache_status(self, data: dict[str, Any]) -> Answer:
        if not self.args.get("admin_api_key"):
            return _json(400, {"error": _ADMIN_MISSING})
        return _json(200, dict(self.hicache))

    def _attach(self, data: dict[str, Any]) -> Answer:
        refused = self._hicache_check("Failed to attach HiCache storage backend.")
        if refused is not None:
            return refused
        if self.hicache.get("hicache_storage_backend") is not None:
            return (
                400,
                TEXT,
                b"Failed to attach HiCache storage backend.\n"
                + (b"Storage backend already attached.\n"),
            )
        backend = data.get("hicache_storage_backend")
        self.hicache["hicache_storage_backend"] = backend
        extra = data.get("hicache_storage_backend_extra_config_json")
        for field, value in (
            ("hicache_storage_backend_extra_config", extra),
            ("hicache_storage_prefetch_policy", data.get("hicache_storage_prefetch_policy")),
            ("hicache_write_policy", data.get("hicache_write_policy")),
        ):
            if value is not None:
                self.hicache[field] = value
        log(f"Attached HiCache storage backend: {backend}")
        return 200, TEXT, b"HiCache storage backend attached.\n"

    def _detach(self, data: dict[str, Any]) -> Answer:
        refused = self._hicache_check("Failed to detach HiCache storage backend.")
        if refused is not None:
            return refused
        self.hicache["hicache_storage_backend"] = None
        self.hicache["hicache_storage_backend_extra_config"] = None
        log("Detached HiCache storage backend.")
        return (
            200,
            TEXT,
            b"HiCache storage backend detached.\nHiCache storage backend is detached.\n",
        )

    # ----------------------------------------------------------------- LoRA

    def _lora_refused(self) -> Answer | None:
        a = self.args
        if not (a.get("enable_lora") or (a.get("enable_lora") is None and a.get("lora_paths"))):
            why = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."
            return _json(400, {"success": False, "error_message": why, "loaded_adapters": None})
        if int(a.get("dp_size") or 1) != 1:
            return 500, TEXT, b"Internal Server Error"  # an AssertionError in SGLang
        return None

    def _lora_answer(self, ok: bool, error: str | None = None) -> Answer:
        body = {"success": ok, "error_message": error, "loaded_adapters": dict(self.loras)}
        return _json(200 if ok else 400, body)

    def _load_lora(self, data: dict[str, Any]) -> Answer:
        refused = self._lora_refused()
        if refused is not None:
            return refused
        name, path = str(data.get("lora_name") or ""), str(data.get("lora_path") or "")
        if name in self.loras:
            return self._lora_answer(
                False, f"Failed to load LoRA adapter {name} because it is already loaded"
            )
        if not Path(path).expanduser().is_dir():
            return self._lora_answer(False, f"Failed to load LoRA adapter {name}: no such {path}")
        refusal = _adapter_refusal(name, Path(path).expanduser())
        if refusal is not None:
            return self._lora_answer(False, refusal)
        self.loras[name] = path
        log(f"Start load Lora adapter. Lora name={name}, path={path}")
        return self._lora_answer(True)

    def _unload_lora(self, data: dict[str, Any]) -> Answer:
        refused = self._lora_refused()
        if refused is not None:
            return refused
        name = str(data.get("lora_name") or "")
        if self.loras.pop(name, None) is None:
            why = f"LoRA with name {name} does not exist. Loaded LoRAs: {list(self.loras)}"
            return self._lora_answer(False, why)
        log(f"Start unload Lora adapter. Lora name={name}")
        return self._lora_answer(True)

    # --------------------------------------------------------------- weights

    def _update_weights(self, data: dict[str, Any]) -> Answer:
        path = str(data.get("model_path") or "")
        load_format = str(data.get("load_format") or self.load_format)
        log(f"Start update_weights. Load format={load_format}")
        found = weight_bytes_from_dir(Path(path).expanduser())
        if found is None:
            why = f"Failed to get weights iterator: no weights in {path!r}."
            return _json(400, {"success": False, "message": why, "num_paused_requests": 0})
        rate = float(os.environ.get(LOAD_RATE_ENV) or 8.0) * 1e9
        with self.model_lock.writing():  # the requests in flight end first; new ones wait
            time.sleep(found[0] / rate)
            if self._update_faults > 0:
                self._update_faults -= 1
                # SGLang's recovery reloads from model_config.model_path, already the new one.
                self.weights_path = path
                why = (
                    f"Failed to update weights: simulated fault update_weights_fail ({path}).\n"
                    "Rolling back to original weights."
                )
                log(f"ERROR: {why}")
                return _json(400, {"success": False, "message": why, "num_paused_requests": 0})
            self.weights_path = self.model_path = self.served_model_name = path
            self.load_format = load_format
            message = "Succeeded to update model weights."
            version = data.get("weight_version")
            if version is not None:
                self.weight_version = str(version)
                message += f" Weight version updated to {version}."
        log("Update weights end.")
        return _json(200, {"success": True, "message": message, "num_paused_requests": 0})


def _adapter_refusal(name: str, path: Path) -> str | None:
    """What SGLang 0.5.23's LoRAManager refuses once it reads the adapter's config
    (srt/lora/lora_config.py:43-45, lora_manager.py:337-351): no readable config with a
    rank, or a DoRA adapter. None when it would load."""
    try:
        config = json.loads((path / "adapter_config.json").read_text())
        int(config["r"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"Failed to load LoRA adapter {name}: {path}/adapter_config.json: {e}"
    if config.get("use_dora", False):
        return f"Failed to load {name} because LoRA serving currently doesn't support DoRA adapters"
    return None
