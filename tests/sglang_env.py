"""SGLang 0.5.23's own environment for the tests that ask SGLang itself (``.venv-sglang``,
built by ``scripts/sglang-parser-env.sh``; ``SGLANG_SUPERVISOR_TEST_SGLANG_PYTHON`` names
another): where it is, the marks that skip without it, and a shared resolver fixture."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_supervisor.sglang.resolution import Resolver

ROOT = Path(__file__).resolve().parents[1]
PYTHON_ENV = "SGLANG_SUPERVISOR_TEST_SGLANG_PYTHON"
SGLANG_PYTHON = os.environ.get(PYTHON_ENV, str(ROOT / ".venv-sglang" / "bin" / "python"))

#: The test process's environment less the supervisor's own test settings: what a
#: resolution runs under.
ENV = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SUPERVISOR")}


def needs_sglang() -> list[pytest.MarkDecorator]:
    """A module's ``pytestmark``: marked ``sglang``, skipped without the environment."""
    if PYTHON_ENV in os.environ and not Path(SGLANG_PYTHON).exists():
        # The test command built it and said where: missing now is a failure, never a skip.
        raise RuntimeError(f"{PYTHON_ENV}={SGLANG_PYTHON} does not exist")
    return [
        pytest.mark.sglang,
        pytest.mark.skipif(
            not Path(SGLANG_PYTHON).exists(),
            reason=f"no SGLang environment at {SGLANG_PYTHON} (scripts/sglang-parser-env.sh)",
        ),
    ]


@pytest.fixture(scope="module")
def resolver() -> Iterator[Resolver]:
    """One resolver per module (its helper processes import SGLang once)."""
    r = Resolver()
    yield r
    r.close()
