"""The NVML GPU probe: ``NvmlProbe``, the real-hardware ``GpuProbe``.

Every NVML call goes through one choke point (``NvmlProbe._guard``), which turns
``pynvml.NVMLError`` into ``GpuQueryError`` with a message that says what failed, on
which GPU, and what the operator can do. ``pynvml`` (package ``nvidia-ml-py``) is imported
and ``nvmlInit`` is called lazily, once, under a lock, on the first query: importing this
module has no side effects and works on hosts without a GPU.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from sglang_supervisor.host.gpu import GpuInfo, GpuProcess, GpuQueryError, GpuSample

log = logging.getLogger(__name__)

#: Inode of the kernel's initial PID namespace (``PROC_PID_INIT_INO`` in
#: ``include/linux/proc_ns.h``, fixed since Linux 3.8).
ROOT_PID_NS_INODE = 0xEFFFFFFC

#: pynvml's "not available" marker for ``usedGpuMemory`` (it maps it to None itself on
#: recent versions; older ones pass the raw value through).
_VALUE_NOT_AVAILABLE = 2**64 - 1

_PROCS_FN = "nvmlDeviceGetComputeRunningProcesses"
_PROCS_FN_V2 = "nvmlDeviceGetComputeRunningProcesses_v2"

_SIMULATE = "or run `sglang-supervisor serve --simulate` to try it without a GPU"


class NvmlFeatureMissing(GpuQueryError):
    """This driver's NVML lacks a function or structure version; an older one may work."""


def pid_namespace_is_root(proc_root: Path = Path("/proc")) -> bool | None:
    """Whether this process lives in the kernel's initial PID namespace.

    NVML reports pids as the host (initial namespace) sees them. They are ours to match
    only when our PID namespace is that one: on the host, in a VM, or in a container run
    with the host's PID namespace (``--pid=host``, ``hostPID: true``).

    Primary signal: the inode of ``/proc/self/ns/pid`` equals ``PROC_PID_INIT_INO``.
    Secondary, when that link cannot be read: more than one entry on the ``NSpid:`` line
    of ``/proc/self/status`` proves a nested namespace. (A single entry proves nothing:
    a container's own procfs shows only its innermost pid.) Returns None when neither
    signal decides.
    """
    try:
        link = os.readlink(proc_root / "self" / "ns" / "pid")
    except OSError:
        link = ""
    match = re.fullmatch(r"pid:\[(\d+)\]", link)
    if match is not None:
        return int(match.group(1)) == ROOT_PID_NS_INODE
    try:
        status = (proc_root / "self" / "status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return False if len(line.split()[1:]) > 1 else None
    return None


class NvmlProbe:
    """``GpuProbe`` over NVML. Thread-safe; NVML is initialised on the first query.

    ``pids_local`` forces the answer of ``pids_are_local`` (an operator's override);
    left None, it is detected from the PID namespace (``pid_namespace_is_root``).
    """

    kind = "nvml"

    def __init__(self, *, pids_local: bool | None = None, proc_root: Path = Path("/proc")) -> None:
        self._lock = threading.Lock()
        self._nvml: ModuleType | None = None
        self._handles: dict[int, Any] = {}
        self._identity: dict[int, tuple[str, str]] = {}
        self._memory_v2: bool | None = None
        self._procs_fn = _PROCS_FN
        self._pids_local = pids_local
        self._proc_root = proc_root

    # -- lifecycle ---------------------------------------------------------------

    def _ready(self) -> ModuleType:
        """Import pynvml and call ``nvmlInit`` once; raise ``GpuQueryError`` if either fails."""
        nvml = self._nvml
        if nvml is not None:
            return nvml
        with self._lock:
            if self._nvml is not None:
                return self._nvml
            try:
                module = importlib.import_module("pynvml")
            except ImportError as exc:
                raise GpuQueryError(
                    "cannot import pynvml: install the `nvidia-ml-py` package into the "
                    f"supervisor's environment, {_SIMULATE}"
                ) from exc
            self._guard(module, "nvmlInit", None)
            self._nvml = module
            return module

    def close(self) -> None:
        """Call ``nvmlShutdown`` if NVML was initialised; a later query initialises again."""
        with self._lock:
            nvml, self._nvml = self._nvml, None
            self._handles.clear()
            self._identity.clear()
            self._memory_v2 = None
            self._procs_fn = _PROCS_FN
        if nvml is not None:
            try:
                self._guard(nvml, "nvmlShutdown", None)
            except GpuQueryError as exc:
                log.warning("%s (ignored while closing the NVML probe)", exc)

    # -- the choke point ---------------------------------------------------------

    def _guard(self, nvml: ModuleType, name: str, gpu: int | None, *args: Any, **kw: Any) -> Any:
        """Call ``nvml.<name>(*args, **kw)``; every NVML call in this module passes here.

        Raises ``NvmlFeatureMissing`` when the driver lacks the function or version, and
        ``GpuQueryError`` for every other NVML failure. Never returns a default value.
        """
        try:
            return getattr(nvml, name)(*args, **kw)
        except nvml.NVMLError as exc:
            raise _explain(nvml, name, gpu, exc) from exc
        except getattr(nvml, "NVMLLibraryMismatchError", ()) as exc:
            raise NvmlFeatureMissing(
                f"NVML {name} failed{_on(gpu)}: the driver's NVML lacks it ({exc}); "
                "update the NVIDIA driver or use an nvidia-ml-py that matches it"
            ) from exc

    def _call(self, name: str, gpu: int | None, *args: Any, **kw: Any) -> Any:
        return self._guard(self._ready(), name, gpu, *args, **kw)

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._call("nvmlDeviceGetHandleByIndex", index, index)
            self._handles[index] = handle
        return handle

    def _uuid_and_name(self, index: int, handle: Any) -> tuple[str, str]:
        known = self._identity.get(index)
        if known is None:
            uuid = _text(self._call("nvmlDeviceGetUUID", index, handle))
            known = (uuid, _text(self._call("nvmlDeviceGetName", index, handle)))
            self._identity[index] = known
        return known

    # -- GpuProbe ----------------------------------------------------------------

    def devices(self) -> list[GpuInfo]:
        """Every GPU NVML sees, in NVML index (PCI bus) order."""
        count = int(self._call("nvmlDeviceGetCount", None))
        out: list[GpuInfo] = []
        for index in range(count):
            handle = self._handle(index)
            uuid, name = self._uuid_and_name(index, handle)
            out.append(
                GpuInfo(
                    index=index,
                    uuid=uuid,
                    name=name,
                    memory_total_bytes=int(self._memory(index, handle).total),
                    capability=self._capability(index, handle),
                    driver_version=self._driver_version(),
                )
            )
        return out

    def _optional(self, name: str, gpu: int | None, *args: Any) -> Any:
        """An NVML query whose answer only refines SGLang's resolution (compute
        capability, driver version): None, logged, when the driver lacks it or fails."""
        nvml = self._ready()
        if not callable(getattr(nvml, name, None)):
            log.info("NVML has no %s (old nvidia-ml-py): %s unknown", name, name[4:])
            return None
        try:
            return self._guard(nvml, name, gpu, *args)
        except GpuQueryError as exc:
            log.warning("%s; SGLang's resolution runs without it", exc)
            return None

    def _capability(self, index: int, handle: Any) -> tuple[int, int] | None:
        """``nvmlDeviceGetCudaComputeCapability``: (major, minor), what SGLang's
        ``torch.cuda.get_device_capability`` reads on this GPU."""
        cap = self._optional("nvmlDeviceGetCudaComputeCapability", index, handle)
        if isinstance(cap, (tuple, list)) and len(cap) == 2:
            return int(cap[0]), int(cap[1])
        return None

    def _driver_version(self) -> str | None:
        """``nvmlSystemGetDriverVersion`` (SGLang's ``get_nvidia_driver_version_str``)."""
        version = self._optional("nvmlSystemGetDriverVersion", None)
        return None if version is None else _text(version)

    def sample(self, indices: Sequence[int]) -> list[GpuSample]:
        """Used memory and compute processes of each GPU in ``indices`` (NVML indices).

        Memory comes from ``nvmlDeviceGetMemoryInfo`` v2 where the driver has it (used
        excludes driver-reserved memory), else v1; the choice is made once per init, so
        a baseline and later samples agree. Graphics processes are ignored. Raises
        ``GpuQueryError`` naming the GPU when any query fails.
        """
        out: list[GpuSample] = []
        for index in indices:
            handle = self._handle(index)
            uuid, name = self._uuid_and_name(index, handle)
            mem = self._memory(index, handle)
            procs = self._processes(index, handle)
            out.append(
                GpuSample(
                    index=index,
                    uuid=uuid,
                    name=name,
                    memory_used_bytes=int(mem.used),
                    memory_total_bytes=int(mem.total),
                    processes=tuple(
                        GpuProcess(pid=int(p.pid), used_bytes=_used_bytes(p)) for p in procs
                    ),
                )
            )
        return out

    def pids_are_local(self) -> bool:
        """True only when NVML's (host) pids are provably in our PID namespace.

        See ``pid_namespace_is_root``; undecidable counts as False, so the caller falls
        back to the memory criterion instead of matching pids that may be someone else's.
        """
        if self._pids_local is None:
            self._pids_local = pid_namespace_is_root(self._proc_root) is True
        return self._pids_local

    # -- helpers -----------------------------------------------------------------

    def _memory(self, index: int, handle: Any) -> Any:
        if self._memory_v2 is not False:
            nvml = self._ready()
            try:
                mem = self._guard(
                    nvml, "nvmlDeviceGetMemoryInfo", index, handle, version=nvml.nvmlMemory_v2
                )
            except NvmlFeatureMissing:
                self._memory_v2 = False
            else:
                self._memory_v2 = True
                return mem
        return self._call("nvmlDeviceGetMemoryInfo", index, handle)

    def _processes(self, index: int, handle: Any) -> Any:
        # nvmlDeviceGetComputeRunningProcesses is v3 (drivers >= 510); older ones have v2.
        try:
            return self._call(self._procs_fn, index, handle)
        except NvmlFeatureMissing:
            if self._procs_fn != _PROCS_FN:
                raise
            self._procs_fn = _PROCS_FN_V2
            return self._call(self._procs_fn, index, handle)


def _on(gpu: int | None) -> str:
    return "" if gpu is None else f" on GPU {gpu}"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _used_bytes(proc: Any) -> int | None:
    used = getattr(proc, "usedGpuMemory", None)
    if used is None or int(used) == _VALUE_NOT_AVAILABLE:
        return None
    return int(used)


def _explain(nvml: ModuleType, name: str, gpu: int | None, exc: Exception) -> GpuQueryError:
    """Turn an ``NVMLError`` into a ``GpuQueryError`` that says what the operator can do."""
    code = getattr(exc, "value", None)

    def is_(const: str) -> bool:
        return code is not None and code == getattr(nvml, const, object())

    what = f"NVML {name} failed{_on(gpu)}: {exc}"
    if is_("NVML_ERROR_LIBRARY_NOT_FOUND"):
        hint = (
            "libnvidia-ml.so.1 could not be loaded; install the NVIDIA driver, or run where "
            "libnvidia-ml.so.1 is visible (in a container: the NVIDIA container toolkit, "
            f"`--gpus`), {_SIMULATE}"
        )
    elif is_("NVML_ERROR_DRIVER_NOT_LOADED"):
        hint = (
            "the NVIDIA kernel driver is not loaded; check `nvidia-smi` and `lsmod | grep "
            f"nvidia`, load it (`modprobe nvidia`) or reboot after a driver install, {_SIMULATE}"
        )
    elif is_("NVML_ERROR_NO_PERMISSION"):
        hint = (
            "insufficient permissions; give the supervisor's user access to /dev/nvidiactl "
            "and /dev/nvidia* (add it to the `video` group or the group owning those devices; "
            "in a container, pass the devices through)"
        )
    elif is_("NVML_ERROR_GPU_IS_LOST"):
        hint = (
            "the GPU fell off the bus; look for Xid errors in `dmesg`, the GPU needs a reset "
            "(`nvidia-smi -r`) or the host a reboot"
        )
    elif is_("NVML_ERROR_RESET_REQUIRED"):
        hint = "the GPU needs a reset (`nvidia-smi -r`) or the host a reboot"
    elif is_("NVML_ERROR_LIB_RM_VERSION_MISMATCH"):
        hint = (
            "the NVML library and the loaded kernel driver are different versions (driver "
            "updated without a reboot?); reboot or reload the nvidia kernel modules"
        )
    elif name == "nvmlDeviceGetHandleByIndex" and (
        is_("NVML_ERROR_INVALID_ARGUMENT") or is_("NVML_ERROR_NOT_FOUND")
    ):
        hint = "NVML has no GPU with this index; fix server.gpus (`nvidia-smi -L` lists them)"
    elif (
        is_("NVML_ERROR_FUNCTION_NOT_FOUND")
        or is_("NVML_ERROR_NOT_SUPPORTED")
        or is_("NVML_ERROR_ARGUMENT_VERSION_MISMATCH")
    ):
        return NvmlFeatureMissing(f"{what}; this driver's NVML does not support it")
    else:
        hint = "the GPU's state is unknown; check `nvidia-smi` on the host"
    return GpuQueryError(f"{what}; {hint}")
