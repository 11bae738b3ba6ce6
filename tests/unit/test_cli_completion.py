"""``sglang-supervisor --version`` and ``completion``: what a user's shell completes."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess

import pytest

from sglang_supervisor.version import version
from sglang_supervisor_api.cli.main import main


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's --version
            code = int(exc.code or 0)
    return code, out.getvalue()


def test_version() -> None:
    assert run("--version") == (0, f"sglang-supervisor {version()}\n")


def complete(shell: str, *words: str) -> list[str]:
    """What bash offers after ``sglang-supervisor WORDS`` (the last word being typed)."""
    code, script = run("completion", shell)
    assert code == 0
    line = " ".join(["sglang-supervisor", *words])
    program = (
        f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words)}; "
        '_sglang_supervisor; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    if shell == "zsh":
        program = program.split("\n", 1)[1]  # zsh's bashcompinit line; bash runs the rest
    done = subprocess.run(
        ["bash", "-c", program], capture_output=True, text=True, timeout=30, check=True
    )
    return sorted(done.stdout.split())


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_offers_commands_options_and_choices(shell: str) -> None:
    assert complete(shell, "ap") == ["apply"]
    assert complete(shell, "cl") == ["cleanup"]
    assert complete(shell, "apply", "--dr") == ["--drain", "--dry-run"]
    assert complete(shell, "serve", "--log-level", "w") == ["warning"]
    assert complete(shell, "cleanup", "--st") == ["--state-dir"]
    assert complete(shell, "completion", "") == ["--help", "-h", "bash", "zsh"]
