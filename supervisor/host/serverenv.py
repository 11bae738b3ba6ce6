"""The environment the SGLang server inherits from the daemon.

Left out: the daemon's own settings (``SGLANG_SUPERVISOR_*``) and systemd's handles that
belong to the unit's main process only — ``NOTIFY_SOCKET`` (a server that notifies would
speak for the daemon: READY, STOPPING, or a MAINPID change), ``WATCHDOG_USEC`` /
``WATCHDOG_PID`` (the daemon's watchdog) and ``LISTEN_FDS`` / ``LISTEN_PID`` /
``LISTEN_FDNAMES`` (socket activation). Added: ``PROMETHEUS_MULTIPROC_DIR`` under the
state directory unless the operator set one. SGLang keeps its metrics files there (a
fresh subdirectory per launch, removed at its exit); left to SGLang it would be a
directory in ``/tmp``, which is the unit's private ``/tmp`` under systemd and is deleted
when the daemon stops: with the keep-server drop-in, the adopted server's ``/metrics``
would then answer empty.

``SGLANG_CACHE_DIR`` (``with_cache_dir``): SGLang 0.5.23 points its JIT caches — Triton,
TorchInductor, CUDA, TileLang, FlashInfer; DeepGEMM's ``SGLANG_DG_CACHE_DIR`` follows —
under it (``srt/environ.py`` ``third_party_cache_defaults``), by default
``~/.cache/sglang``: kept across restarts only where HOME happens to persist. The server
gets it explicitly, a persistent directory (``[server] sglang_cache_dir``, default
``<state_dir>/.cache/sglang``: where SGLang's default put it under the systemd unit and
the container, whose HOME is the state directory, so an upgrade keeps what was compiled),
unless the operator set one; and ``SGLANG_JIT_CACHE_DIR`` beside it (``<dir>/jit``), which
0.5.23 does not derive from it (``kernels/jit/utils/compile/cache.py:318``: ``~/.cache/
sglang/jit``). On Slurm each node's server reads the path on its own disk: set a
node-local directory there.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

#: Variables systemd sets for the unit's main process only.
SYSTEMD_MAIN_PROCESS_VARS = frozenset(
    {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"}
)
MULTIPROC_VAR = "PROMETHEUS_MULTIPROC_DIR"
CACHE_VAR = "SGLANG_CACHE_DIR"
JIT_CACHE_VAR = "SGLANG_JIT_CACHE_DIR"


def multiproc_dir(state_dir: Path) -> Path:
    return state_dir / "prometheus"


def server_environ(environ: Mapping[str, str], state_dir: Path) -> dict[str, str]:
    """``environ`` as the server should inherit it (see the module's docstring).

    Creates ``<state_dir>/prometheus`` (SGLang requires the directory to exist).
    """
    env = {
        k: v
        for k, v in environ.items()
        if not k.startswith("SGLANG_SUPERVISOR_") and k not in SYSTEMD_MAIN_PROCESS_VARS
    }
    if MULTIPROC_VAR not in env:
        path = multiproc_dir(state_dir)
        path.mkdir(parents=True, exist_ok=True)
        env[MULTIPROC_VAR] = str(path)
    return env


def sglang_cache_dir(setting: str | None, state_dir: Path) -> Path:
    """The cache directory the daemon gives the server: ``[server] sglang_cache_dir``,
    else ``<state_dir>/.cache/sglang``."""
    return Path(setting).expanduser() if setting else state_dir / ".cache" / "sglang"


def with_cache_dir(env: Mapping[str, str], default: Path) -> dict[str, str]:
    """``env`` with ``SGLANG_CACHE_DIR`` (``default`` unless ``env`` has one; created) and
    ``SGLANG_JIT_CACHE_DIR`` beside it (unless ``env`` has one)."""
    out = dict(env)
    if not out.get(CACHE_VAR):
        default.mkdir(parents=True, exist_ok=True)
        out[CACHE_VAR] = str(default)
    out.setdefault(JIT_CACHE_VAR, str(Path(out[CACHE_VAR]).expanduser() / "jit"))
    return out
