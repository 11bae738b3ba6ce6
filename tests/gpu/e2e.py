"""The host side of the real-mode end-to-end test: GPUs, the server's interpreter, figures.

* ``Host``: the GPUs as NVML sees them, a probe for the test's own readings (the test
  process never creates a CUDA context), foreign GPU processes, CUDA's own device order.
  Mode ``nvml`` is real GPUs; mode ``fake`` (``SGS_E2E_FAKE_NVML=1``) rehearses the same
  test on a CPU-only host: the daemon imports ``tests/gpu/fake_nvml/pynvml.py`` and the
  stand-in's ranks register their bytes instead of allocating them.
* ``make_server_python``: a throwaway virtual environment whose ``.pth`` puts the
  SGLang-shaped stand-in (``tests/gpu/sglang_standin``) before a real SGLang 0.5.23, then
  the test interpreter's own site-packages (torch). Its interpreter is ``server.python``.
* ``Monitor``: samples every managed GPU every 10 ms in a thread, for per-GPU release times.
* ``Figures``: what each step measured, written as JSON to ``$SGS_E2E_RESULTS``.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
import threading
import time
import venv
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from sglang_supervisor.host.gpu import GpuInfo, GpuProbe, GpuQueryError, cuda_visible_devices

HERE = Path(__file__).resolve().parent
STANDIN_ROOT = HERE / "sglang_standin"
FAKE_NVML_DIR = HERE / "fake_nvml"
REPO = HERE.parents[1]
#: The test command's stand-ins for SGLang's GPU kernel modules (tests only).
KERNEL_STUBS = REPO / "tests" / "sglang_stubs" / "sglang_test_stubs.py"
GIB = 2**30
FAKE_GPU_MIB = 143771

_FOREIGN = (
    "import sys, time, torch\n"
    "x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device='cuda'); x.fill_(7)\n"
    "torch.cuda.synchronize(); print('HOLDING', flush=True); time.sleep(900)\n"
)
_CUDA_ORDER = (
    "import json, torch\n"
    "print(json.dumps([str(torch.cuda.get_device_properties(i).uuid)"
    " for i in range(torch.cuda.device_count())]))\n"
)


_ONLY_MISSING = """\
import importlib.machinery

import sglang_test_stubs

installed = {n for n in sglang_test_stubs.STUBBED if importlib.machinery.PathFinder.find_spec(n)}
sglang_test_stubs.STUBBED = frozenset(sglang_test_stubs.STUBBED - installed)
"""


def fake_mode() -> bool:
    return os.environ.get("SGS_E2E_FAKE_NVML", "") == "1"


class Host:
    """The GPUs of this host, real (NVML) or fake; skip reasons when there are none."""

    def __init__(self, workdir: Path) -> None:
        self.mode = "fake" if fake_mode() else "nvml"
        self.daemon_env: dict[str, str] = {}
        self.probe: GpuProbe
        if self.mode == "fake":
            from sglang_supervisor.sim.gpus import SimGpuProbe

            registry = workdir / "fake-gpus"
            registry.mkdir()
            count = int(os.environ.get("FAKE_NVML_GPUS", "1"))
            self.registry = registry
            self.probe = SimGpuProbe(registry, count=count, memory_total_mib=FAKE_GPU_MIB)
            self.baseline_extra = 512 * 2**20  # the fake NVML's baseline (FAKE_NVML_BASELINE_MIB)
            self.daemon_env = {
                "PYTHONPATH": os.pathsep.join([str(FAKE_NVML_DIR), str(REPO)]),
                "FAKE_NVML_REGISTRY": str(registry),
                "FAKE_NVML_GPUS": str(count),
                "FAKE_NVML_MEMORY_MIB": str(FAKE_GPU_MIB),
                "SGLANG_STANDIN_FAKE_GPU_DIR": str(registry),
                "SGLANG_STANDIN_FAKE_GPU_MIB": str(FAKE_GPU_MIB),
            }
        else:
            from sglang_supervisor.host.nvml import NvmlProbe

            self.registry = workdir
            self.probe = NvmlProbe()
            self.baseline_extra = 0
            path = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
            self.daemon_env = {"PYTHONPATH": os.pathsep.join(path)}
        self.gpus: list[GpuInfo] = self.probe.devices()  # GpuQueryError: no NVML

    def used(self) -> dict[int, int]:
        return {s.index: s.memory_used_bytes for s in self.probe.sample(self.indices())}

    def pids(self) -> dict[int, set[int]]:
        return {s.index: {p.pid for p in s.processes} for s in self.probe.sample(self.indices())}

    def indices(self) -> list[int]:
        return [g.index for g in self.gpus]

    def pids_are_local(self) -> bool:
        return self.probe.pids_are_local()

    def spawn_foreign(self, gpu: GpuInfo, nbytes: int) -> subprocess.Popen[bytes]:
        """A process not of the server's tree holding ``nbytes`` on ``gpu``; waits until it does."""
        if self.mode == "fake":
            argv = [
                sys.executable,
                "-m",
                "sglang_supervisor.sim.rank",
                "--registry",
                str(self.registry),
            ]
            argv += ["--gpu-uuid", gpu.uuid, "--bytes", str(nbytes)]
            env = {**os.environ, "PYTHONPATH": str(REPO)}
        else:
            argv = [sys.executable, "-c", _FOREIGN, str(nbytes)]
            env = {**os.environ, **cuda_visible_devices([gpu])[1]}
        env.pop("SGLANG_SUPERVISOR_INSTANCE", None)
        proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO
        )
        assert proc.stdout is not None
        line = proc.stdout.readline().decode(errors="replace")
        if "HOLDING" not in line.upper():
            proc.kill()
            raise AssertionError(f"the foreign GPU process did not start: {line!r}")
        return proc

    def cuda_order(self) -> list[str]:
        """GPU UUIDs in CUDA's default order (no CUDA_VISIBLE_DEVICES), asked of torch."""
        if self.mode == "fake":
            return [g.uuid for g in self.gpus]
        env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES",)}
        env.pop("CUDA_DEVICE_ORDER", None)
        out = subprocess.run(
            [sys.executable, "-c", _CUDA_ORDER],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return [normal_uuid(u) for u in json.loads(out.stdout.strip().splitlines()[-1])]


def alive(pids: list[int]) -> list[int]:
    """The pids still running (a zombie holds no memory and counts as gone)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out


def normal_uuid(value: str) -> str:
    """``GPU-xxxxxxxx-...`` lower-case, whether torch or NVML wrote it."""
    v = value.strip().lower()
    return v if v.startswith("gpu-") else f"gpu-{v}"


def real_sglang_dirs() -> tuple[list[str], str | None]:
    """Directories holding a real SGLang and its parser's dependencies, or a skip reason.

    ``SGS_E2E_SGLANG_SITE`` (``os.pathsep``-separated), else the site-packages of
    ``SGLANG_SUPERVISOR_TEST_SGLANG_PYTHON`` (the parser environment of the test command).
    """
    explicit = os.environ.get("SGS_E2E_SGLANG_SITE", "")
    if explicit:
        return [d for d in explicit.split(os.pathsep) if d], None
    python = os.environ.get("SGLANG_SUPERVISOR_TEST_SGLANG_PYTHON", "")
    if not python:
        return [], "no SGLang: set SGS_E2E_SGLANG_SITE or SGLANG_SUPERVISOR_TEST_SGLANG_PYTHON"
    code = "import sys, sysconfig; print(sysconfig.get_paths()['purelib'], *sys.version_info[:2])"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
        purelib, major, minor = out.stdout.split()
        version = f"{major}.{minor}"
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return [], f"cannot ask {python} where SGLang is: {exc}"
    ours = "{}.{}".format(*sys.version_info[:2])
    if version != ours:
        return [], f"{python} is Python {version}, the test runs {ours}: compiled deps differ"
    return [purelib], None


def make_server_python(where: Path, sglang_dirs: list[str]) -> Path:
    """A venv: stand-in first, then the real SGLang, then this interpreter's packages."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    purelib = Path(
        sysconfig.get_paths(vars={"base": str(where), "platbase": str(where)})["purelib"]
    )
    # PYTHONPATH too: a probe run with ``python -I`` ignores it, the server does not.
    env_path = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    pythonpath = [os.path.abspath(p) for p in env_path if p]
    ours = [*pythonpath, *site.getsitepackages(), sysconfig.get_paths()["purelib"]]
    lines = [str(STANDIN_ROOT), *sglang_dirs, *dict.fromkeys(ours)]
    if KERNEL_STUBS.exists() and os.environ.get("SGS_E2E_STUB_KERNELS", "1") == "1":
        # A test environment, as the test command's: SGLang's GPU kernel packages (not
        # installed here) import as inert stubs, so its resolution pipeline can be imported
        # and run. Only the ones this environment really lacks are stubbed.
        (purelib / KERNEL_STUBS.name).write_bytes(KERNEL_STUBS.read_bytes())
        (purelib / "_e2e_kernel_stubs.py").write_text(_ONLY_MISSING)
        lines.append("import _e2e_kernel_stubs")
    (purelib / "00-sglang-standin.pth").write_text("\n".join(lines) + "\n")
    return where / "bin" / "python"


def write_tiny_model(where: Path) -> Path:
    """A model directory with a small Llama ``config.json`` (no weights: nothing loads them)."""
    where.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 1024,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
    }
    (where / "config.json").write_text(json.dumps(config))
    return where


class Monitor:
    """Every ``interval_s``: used bytes of each GPU, with wall time (phases carry wall times)."""

    def __init__(self, host: Host, interval_s: float = 0.01) -> None:
        self.host, self.interval_s = host, interval_s
        self.samples: list[tuple[float, dict[int, int]]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                used = self.host.used()
            except GpuQueryError:
                self.errors += 1
            else:
                self.samples.append((time.time(), used))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def first_at_or_below(self, index: int, limit: int, after: float) -> float | None:
        for t, used in self.samples:
            if t >= after and used.get(index, limit + 1) <= limit:
                return t
        return None

    def release_s(self, after: float, baseline: dict[int, int], tol: int) -> dict[str, Any]:
        """Per GPU: seconds from ``after`` until it first read ≤ baseline + tolerance."""
        out: dict[str, Any] = {}
        for index, base in baseline.items():
            t = self.first_at_or_below(index, base + tol, after)
            out[str(index)] = None if t is None else round(t - after, 4)
        return out


def wall(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def phases(op: dict[str, Any]) -> dict[str, Any]:
    return {p["name"]: {"s": p["duration_s"], "state": p["state"]} for p in op.get("phases", [])}


class Figures:
    """Per-step figures; printed as they come and written whole to ``$SGS_E2E_RESULTS``."""

    def __init__(self, meta: dict[str, Any]) -> None:
        self.data: dict[str, Any] = {"meta": meta, "steps": {}}

    def step(self, name: str, **values: Any) -> None:
        self.data["steps"].setdefault(name, {}).update(values)
        print(f"\nE2E {name} " + json.dumps(values, sort_keys=True, default=str))
        self.save()

    def save(self) -> None:
        out = os.environ.get("SGS_E2E_RESULTS")
        if out:
            Path(out).write_text(json.dumps(self.data, indent=1, sort_keys=True, default=str))
