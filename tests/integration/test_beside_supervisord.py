"""Supervisord and sglang-supervisor in one environment: both run.

PyPI's Supervisord installs the import package ``supervisor``; this package's source
directory is named ``supervisor/`` too, but it installs as ``sglang_supervisor`` and
``sglang_supervisor_api`` (setuptools' package-dir mapping, pyproject.toml), so neither
overwrites the other. This test builds a real wheel of this checkout and installs it with
Supervisord into one fresh venv (~20-40 s with pip's cache), then runs both programs from a
directory that is not the checkout (where ``supervisor/`` would shadow nothing of ours).
It needs pip to reach an index (or a local one); it runs in CI like every other test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.install

#: Every module of ours, imported from the installed wheel (also proves the wheel holds
#: every subpackage: the package list in pyproject.toml is written by hand).
IMPORT_ALL = """
import importlib, json, pkgutil, sys
import sglang_supervisor, sglang_supervisor_api
names = []
for pkg in (sglang_supervisor, sglang_supervisor_api):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        if m.name.endswith(("_probe", ".__main__")) or ".sim.server" in m.name:
            continue
        importlib.import_module(m.name)
        names.append(m.name)
import supervisor.states
print(json.dumps({
    "ours": names,
    "ours_file": sglang_supervisor.__file__,
    "supervisord_states": supervisor.states.__file__,
    "has_SupervisorStates": hasattr(supervisor.states, "SupervisorStates"),
}))
"""


def run(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def shared_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding PyPI's Supervisord and a wheel of this checkout."""
    where = tmp_path_factory.mktemp("beside-supervisord")
    venv.EnvBuilder(with_pip=True).create(where / "venv")
    pip = [str(where / "venv/bin/python"), "-m", "pip", "install", "-q"]
    r = run([*pip, "supervisor>=4.2,<5"], where)
    assert r.returncode == 0, f"pip could not install Supervisord: {r.stderr[-3000:]}"
    # A copy of the checkout's sources: setuptools builds in the source tree (build/), where
    # a module deleted since an earlier build would still be picked up.
    src = where / "src"
    skip = shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "results")
    shutil.copytree(ROOT, src, ignore=skip)
    r = run([*pip, str(src)], where)
    assert r.returncode == 0, f"pip could not install this checkout: {r.stderr[-3000:]}"
    return where


def test_supervisord_and_sglang_supervisor_both_run(shared_env: Path) -> None:
    bin_ = shared_env / "venv/bin"
    r = run([str(bin_ / "supervisord"), "--version"], shared_env, 60)
    assert r.returncode == 0, f"supervisord broken beside us: {r.stdout}{r.stderr}"
    assert r.stdout.strip().startswith("4."), r.stdout
    r = run([str(bin_ / "sglang-supervisor"), "--version"], shared_env, 60)
    assert r.returncode == 0, r.stderr
    assert "sglang-supervisor" in r.stdout + r.stderr
    r = run([str(bin_ / "python"), "-m", "sglang_supervisor_api.cli", "--help"], shared_env, 60)
    assert r.returncode == 0, r.stderr
    assert "serve" in r.stdout


def test_the_wheel_installs_nothing_named_supervisor_or_api(shared_env: Path) -> None:
    r = run([str(shared_env / "venv/bin/python"), "-c", IMPORT_ALL], shared_env, 120)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert seen["has_SupervisorStates"], seen  # Supervisord's own module, intact
    assert "site-packages" in seen["ours_file"], seen  # the wheel, not the checkout
    assert "sglang_supervisor.engine.supervisor" in seen["ours"]
    assert "sglang_supervisor_api.cli.main" in seen["ours"]
    site = Path(seen["supervisord_states"]).parents[1]
    assert not (site / "api").exists(), f"something installed a top-level 'api' in {site}"
    records = "".join(p.read_text() for p in site.glob("sglang_supervisor-*.dist-info/RECORD"))
    tops = {line.split("/", 1)[0] for line in records.splitlines()}
    assert "supervisor" not in tops and "api" not in tops, sorted(tops)


def test_the_editable_install_runs_from_another_directory(tmp_path: Path) -> None:
    """The test environment's own install (``pip install -e .``) imports the package from
    any directory, through setuptools' editable hook (the directories are not on the path)."""
    r = run([sys.executable, "-m", "sglang_supervisor_api.cli", "--help"], tmp_path, 60)
    assert r.returncode == 0, r.stderr
    assert "serve" in r.stdout
    r = run([sys.executable, "-c", "import sglang_supervisor.sim.server"], tmp_path, 60)
    assert r.returncode == 0, r.stderr
