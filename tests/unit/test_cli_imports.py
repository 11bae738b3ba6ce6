"""The CLI's client commands import no server stack (issue 27 §8): ``--version`` took 5-8 s
on a loaded machine when ``cli/client.py`` reached FastAPI through ``api/auth.py``, and
every TAB after ``--set`` paid the same. The daemon (``serve``) is the only command that
needs FastAPI, uvicorn or Starlette.

Each check runs a fresh interpreter: what a module imports is only visible in one that has
imported nothing yet.
"""

from __future__ import annotations

import re
import subprocess
import sys

from tests.helpers import free_port

SERVER_STACK = ("fastapi", "uvicorn", "starlette")


def _server_modules(names: list[str]) -> list[str]:
    return sorted(n for n in names if n.split(".")[0] in SERVER_STACK)


def test_version_imports_no_server_stack() -> None:
    """``-X importtime`` lists every module the command imported, itself included."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "sglang_supervisor_api.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.startswith("sglang-supervisor "), done.stderr
    imported = re.findall(r"^import time:\s+\d+ \|\s+\d+ \| *(\S+)$", done.stderr, re.M)
    assert "sglang_supervisor_api.cli.main" in imported  # the parser was built
    assert _server_modules(imported) == []


#: Every client command, against a daemon that is not there (each fails: exit 1).
_COMMANDS = [
    ["status"],
    ["levers"],
    ["schema", "hicache"],
    ["logs", "-n", "5"],
    ["events"],
    ["operations"],
    ["operations", "show", "abc123"],
    ["apply", "--set", "mem_fraction_static=0.9"],
    ["stop"],
    ["cancel", "abc123"],
    ["reconcile", "--dry-run"],
    ["plan"],
]

_PROGRAM = """
import contextlib, io, json, sys
from sglang_supervisor_api.cli import main
url, commands = sys.argv[1], json.loads(sys.argv[2])
codes = []
for argv in commands:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        codes.append(main([*argv, "--url", url]))
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    codes.append(main(["rollout", "--daemon", url, "--set", "mem_fraction_static=0.9"]))
print(json.dumps({"codes": codes, "modules": sorted(sys.modules)}))
"""


def test_client_commands_against_nothing_import_no_server_stack() -> None:
    import json

    url = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM, url, json.dumps(_COMMANDS)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "SGLANG_SUPERVISOR_CONFIG": "/nonexistent.toml"},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["codes"] == [1] * (len(_COMMANDS) + 1)  # each: the daemon unreachable
    assert "httpx" in result["modules"]  # they did talk (or try to)
    assert _server_modules(result["modules"]) == []
