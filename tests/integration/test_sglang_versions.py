"""Another SGLang in ``server.python``: /status, the status page's data and the plan say
which SGLang answered, which parts are SGLang 0.5.23's own knowledge (the planner's
formulas, the range tables, the bundled schema) and when validation is degraded — never
silently (issue 20 §3).

The other SGLangs are tiny packages on a temp dir's ``sys.path`` (a ``server.python``
wrapper puts it first on ``PYTHONPATH``): ``sglang`` 0.6.0 runs 0.5.23's code under
another version (same API), and a second one also renames the resolution entry point
``ServerArgs.resolve_once`` (what ``resolve_probe.py`` calls, ``server_args.py:244``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import Daemon, wait_until
from tests.integration.sglang_corpus import LLAMA_8B
from tests.sglang_env import SGLANG_PYTHON, needs_sglang

# Each daemon imports SGLang twice at start (its schema, its resolution helper), and a
# degraded validation runs SGLang's parser in a new interpreter: slow on a loaded 2-core host.
pytestmark = [*needs_sglang(), pytest.mark.timeout(900)]

FAKE_INIT = """
import os as _os
import sysconfig as _sc
_REAL = _os.path.join({purelib!r}, "sglang")
__path__.append(_REAL)  # every submodule is the real one: the same API
with open(_os.path.join(_REAL, "__init__.py")) as _f:
    exec(compile(_f.read(), _os.path.join(_REAL, "__init__.py"), "exec"))
__version__ = "0.6.0"
"""
RENAME = """
from sglang.srt import server_args as _sa
_sa.ServerArgs.resolve_pipeline = _sa.ServerArgs.resolve_once
del _sa.ServerArgs.resolve_once
"""


def fake_sglang(tmp: Path, *, renamed: bool) -> str:
    """A ``server.python`` whose ``sglang`` is 0.6.0 (entry point renamed or not)."""
    import subprocess

    purelib = subprocess.run(
        [SGLANG_PYTHON, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    site = tmp / "site"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text(
        FAKE_INIT.format(purelib=purelib) + (RENAME if renamed else "")
    )
    dist = site / "sglang-0.6.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.6.0\n")
    wrapper = tmp / "python"
    wrapper.write_text(
        f'#!/bin/sh\nPYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{SGLANG_PYTHON}" "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return str(wrapper)


def _daemon(tmp: Path, python: str) -> Daemon:
    return Daemon(
        tmp,
        gpus=8,
        levers={"model_path": LLAMA_8B, "tp_size": 8, "mem_fraction_static": 0.85},
        extra={"server": {"python": python}},
        sim={"host_ram_gib": 512},
    )


def _checked(d: Daemon) -> dict[str, Any]:
    """/status once the SGLang check is over (its helper imported SGLang)."""

    def done() -> dict[str, Any] | None:
        s = d.status()
        return s if s["sglang"]["validation"] != "checking" else None

    return wait_until(done, 180, 0.2, "the SGLang check")


@pytest.fixture(scope="module")
def newer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("sglang060")
    d = _daemon(tmp, fake_sglang(tmp, renamed=False))
    d.start()
    yield d
    assert d.stop() == 0
    d.client.close()


@pytest.fixture(scope="module")
def renamed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("sglang060renamed")
    d = _daemon(tmp, fake_sglang(tmp, renamed=True))
    d.start()
    yield d
    assert d.stop() == 0
    d.client.close()


def test_a_newer_sglang_is_named_with_what_is_0_5_23_knowledge(newer: Daemon) -> None:
    s = _checked(newer)
    sg = s["sglang"]
    assert sg["version"] == "0.6.0" and sg["validation"] == "full", sg
    assert sg["path"].endswith(os.path.join("site", "sglang")), sg
    assert sg["knowledge_from"] == "0.5.23"
    assert "planner's formulas" in sg["reason"] and "0.5.23's own knowledge" in sg["reason"]
    assert sg["reason"] in s["warnings"]
    # Validation works: SGLang 0.6.0's own resolution answers an apply.
    r = newer.apply({"chunked_prefill_size": 4096}, dry_run=True)
    assert r.status_code == 200, r.text
    assert r.json()["operation"]["resolved"]["chunked_prefill_size"] == 4096
    plan = newer.client.post("/plan", json={}).json()
    assert plan["sglang"]["version"] == "0.6.0", plan.get("sglang")
    assert any("SGLang 0.6.0 answered" in n and "0.5.23" in n for n in plan["notes"]), plan


def test_a_renamed_entry_point_degrades_validation_and_says_so(renamed: Daemon) -> None:
    s = _checked(renamed)
    sg = s["sglang"]
    assert sg["validation"] == "degraded", sg
    assert "sglang.srt.server_args.ServerArgs.resolve_once" in sg["missing"], sg
    assert "resolve_once" in sg["reason"] and "cannot run" in sg["reason"]
    assert any("resolve_once" in w for w in s["warnings"]), s["warnings"]
    # An apply is no longer refused wholesale: SGLang's parser and checks answer, and
    # the operation says validation was degraded.
    pid = s["server"]["pid"]
    r = renamed.client.post(
        "/levers",
        params={"wait": "true"},
        json={"levers": {"chunked_prefill_size": 4096}},
        timeout=600,
    )
    assert r.status_code == 200, r.text
    op = r.json()["operation"]
    assert op["state"] == "succeeded", op
    validate = op["phases"][0]
    assert validate["name"] == "validate" and "validation degraded" in validate["detail"]
    assert renamed.status()["server"]["pid"] != pid
    # The plan says the planner's own rule decided, and why.
    plan = renamed.client.post("/plan", json={}).json()
    assert any("was not asked" in n and "resolve_once" in n for n in plan["notes"]), plan
