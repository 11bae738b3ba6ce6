"""The server's interpreter is asked about SGLang in the environment the server inherits:
an SGLang reachable only through PYTHONPATH is found (issue 11: with ``python -I`` it was
seen as "no SGLang" and every apply was refused)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sglang_supervisor.sglang.parser import sglang_version


def test_an_sglang_on_pythonpath_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("__version__ = '9.9.9'\n")
    dist = tmp_path / "sglang-9.9.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 9.9.9\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert sglang_version(sys.executable) == "9.9.9"
    monkeypatch.delenv("PYTHONPATH")
    assert sglang_version(sys.executable) is None
