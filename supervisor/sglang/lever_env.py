"""The server's environment a lever set may set (``env``): the routine tuning families
are accepted; a variable that makes the server load or run code from a path — a library,
a plugin, an injection, a kernel or extension cache, a compiler's toolkit, a package to
import — or write to a file it names is refused like ``LD_*``, as are the daemon's own
``SGLANG_SUPERVISOR_*`` settings (``env_name_problem``).

The names come from SGLang 0.5.23's ``srt/environ.py`` and from what its environment's
libraries read (torch's ``cpp_extension``, flashinfer, DeepGEMM, NCCL, Triton); the
suffix rules catch the rest of each kind.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from sglang_supervisor.sglang.lever_limits import shown

#: Families an operator tunes per lever set.
ENV_PREFIXES = (
    "NCCL_",
    "SGLANG_",
    "SGL_",
    "CUDA_",
    "TORCH_",
    "PYTORCH_",
    "NVSHMEM_",
    "GLOO_",
    "HF_",
    "TRITON_",
    "UCX_",
)
ENV_NAMES = frozenset(
    {
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "TOKENIZERS_PARALLELISM",
        "TRANSFORMERS_OFFLINE",
        "NVIDIA_TF32_OVERRIDE",
    }
)
#: Names (inside the families above) that make the server load code from a path.
ENV_CODE_LOADERS = frozenset(
    {
        "CUDA_INJECTION64_PATH",
        "CUDA_INJECTION32_PATH",
        "CUDA_CACHE_PATH",  # JIT-compiled GPU binaries are loaded from it
        "NCCL_NET_PLUGIN",
        "NCCL_TUNER_PLUGIN",
        "NCCL_PROFILER_PLUGIN",
        "NCCL_ENV_PLUGIN",
        "NCCL_GIN_PLUGIN",
        "NCCL_RAS_PLUGIN",
        "NCCL_CONF_FILE",  # a file of NCCL variables, plugins included
        "NVSHMEM_BOOTSTRAP_PLUGIN",
        "TORCH_EXTENSIONS_DIR",
        "PYTORCH_KERNEL_CACHE_PATH",
        "TRITON_CACHE_DIR",
        "TRITON_HOME",
        "TRITON_OVERRIDE_DIR",
        "TRITON_KERNEL_OVERRIDE",
        "TRITON_LIBDEVICE_PATH",
        "HF_MODULES_CACHE",  # remote code of trust_remote_code models
        "SGLANG_CUSTOM_OPS_PATH",
        # The CUDA toolkit the JIT builds run nvcc from (torch.utils.cpp_extension,
        # flashinfer, DeepGEMM read CUDA_HOME, then CUDA_PATH).
        "CUDA_HOME",
        "CUDA_PATH",
        "CUDA_ROOT",
        "CUDA_INC_PATH",
        "PYTORCH_NVCC",
        # A shared library, a package or an app SGLang imports (srt/environ.py).
        "SGLANG_NCCL_SO_PATH",
        "SGLANG_EXTERNAL_MODEL_PACKAGE",
        "SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE",
        "SGLANG_HTTP_SERVER_APP_PATH",
        "SGLANG_TEST_SCRIPTED_RUNTIME_SYS_PATH_ENTRY",
        # Caches of compiled kernels SGLang loads (as TRITON_CACHE_DIR above).
        "SGLANG_DG_CACHE_DIR",
        "SGLANG_CUTE_AOT_CACHE_DIR",
        "SGLANG_JIT_CACHE_DIR",
        "NVSHMEM_LIB_DIR",
    }
)
_CODE_LOADER_SUFFIXES = (
    "_PLUGIN",
    "_PLUGIN_PATH",
    "_PLUGIN_LIB",
    "_MODULE_DIR",
    "_LIBRARY_PATH",
    "_PRELOAD",
    "_CONF_FILE",
)
_CODE_LOADER_PATTERN = re.compile(r"INJECTION|^TRITON_.*_PATH$|^TRITON_.*_DIR$|_SO_PATH$|_PACKAGE$")
#: A file the server writes (a debug log, a dump, a core file: as the daemon's user,
#: root under systemd) or reads as configuration: ``NCCL_DEBUG_FILE``,
#: ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, ``NCCL_TOPO_DUMP_FILE``, ``CUDA_COREDUMP_FILE``,
#: ``SGLANG_TEST_METRICS_FILE``; and the directories SGLang writes dumps, profiles and
#: recordings into (``SGLANG_TORCH_PROFILER_DIR``, ``SGLANG_CUDA_COREDUMP_DIR``,
#: ``SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR``, ``SGLANG_DUMP_LOADER_DIR``...).
_PATH_WRITER_PATTERN = re.compile(
    r"_FILE$|(DUMP|DEBUG|PROFILER|PROFILE|COREDUMP|RECORDER|LOG|OUTPUT|TRACE|ARTIFACT)[A-Z_]*_DIR$"
)
#: The daemon's own settings (``SGLANG_SUPERVISOR_<SECTION>__<KEY>``) and launch tag.
DAEMON_ENV_PREFIX = "SGLANG_SUPERVISOR_"
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def env_name_problem(key: str, owned: Mapping[str, str]) -> str | None:
    """None when ``key`` may be set in the server's environment, else the reason."""
    if not _ENV_NAME.match(key):
        return f"{shown(key)!r} is not a valid environment variable name"
    if key in owned:
        return f"cannot be set by a lever: {owned[key]}"
    if key.startswith(DAEMON_ENV_PREFIX):
        return (
            f"{key} is not allowed: {DAEMON_ENV_PREFIX}* are this daemon's own settings and "
            "launch tag, never the server's (set a daemon setting in its config file)"
        )
    if key.startswith(("LD_", "PYTHON")) or key == "PATH":
        return (
            f"{key} is not allowed: LD_*, PYTHON* and PATH would change what code the server runs"
        )
    if (
        key in ENV_CODE_LOADERS
        or key.endswith(_CODE_LOADER_SUFFIXES)
        or _CODE_LOADER_PATTERN.search(key)
    ):
        return (
            f"{key} is not allowed: it makes the server load or run code (a library, "
            "plugin, injection, kernel cache, compiler toolkit or package) from a path, "
            "like LD_PRELOAD; set it in the service's own environment if the host needs it"
        )
    if _PATH_WRITER_PATTERN.search(key):
        return (
            f"{key} is not allowed: the server writes to (or reads) the path it names, as "
            "the daemon's user (root under systemd); set it in the service's own "
            "environment if the host needs it"
        )
    if key in ENV_NAMES or key.startswith(ENV_PREFIXES):
        return None
    families = ", ".join(p + "*" for p in ENV_PREFIXES)
    return f"{key} is not allowed: only {families} and {', '.join(sorted(ENV_NAMES))} may be set"
