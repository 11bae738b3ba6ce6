"""``sglang-supervisor --version`` and ``completion``: what a user's shell completes."""

from __future__ import annotations

import contextlib
import http.server
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_supervisor.version import version
from sglang_supervisor_api.cli.completion_fish import fish_quote
from sglang_supervisor_api.cli.main import main
from tests.helpers import free_port


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
    assert complete(shell, "completion", "") == [
        "--help",
        "--lever-names",
        "-h",
        "bash",
        "fish",
        "zsh",
    ]


# ----------------------------------------------------------- lever names, fish

BIN = str(Path(sys.executable).parent)  # where the console script sglang-supervisor is


def _shell_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_SUPERVISOR_")}
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    # No daemon there: the names come from the bundled schema.
    env["SGLANG_SUPERVISOR_URL"] = f"http://127.0.0.1:{free_port()}"
    env.update(extra)
    return env


@contextlib.contextmanager
def fake_daemon(flags: list[str]) -> Iterator[str]:
    """A loopback HTTP server answering ``GET /levers/schema`` with ``flags``: proof that
    the names came from the daemon (no bundled schema has these)."""
    body = json.dumps({"flags": [{"dest": f} for f in flags]}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path.startswith("/levers/schema")
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body) if ok else 0))
            self.end_headers()
            if ok:
                self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def complete_bash(*words: str, env: dict[str, str]) -> list[str]:
    _, script = run("completion", "bash")
    line = " ".join(["sglang-supervisor", *words])
    program = (
        f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words)}; "
        '_sglang_supervisor; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(
        ["bash", "-c", program], capture_output=True, text=True, timeout=60, env=env, check=True
    )
    return sorted(done.stdout.split())


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completes_lever_names_from_the_daemon_else_the_bundled_schema() -> None:
    bundled = _shell_env()
    assert complete_bash("apply", "--set", "mem_frac", env=bundled) == ["mem_fraction_static="]
    assert complete_bash("apply", "--unset", "kv_cache_d", env=bundled) == ["kv_cache_dtype"]
    assert complete_bash("rollout", "--set", "port", env=bundled) == []  # owned by us
    with fake_daemon(["zz_from_the_daemon", "zz_other"]) as url:
        env = _shell_env(SGLANG_SUPERVISOR_URL=url)
        assert complete_bash("apply", "--set", "zz_f", env=env) == ["zz_from_the_daemon="]
        assert complete_bash("apply", "--set", "mem_frac", env=env) == []


def test_lever_names_command() -> None:
    env = _shell_env()
    done = subprocess.run(
        ["sglang-supervisor", "completion", "--lever-names"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    names = done.stdout.split()
    assert "mem_fraction_static" in names and names == sorted(names)
    assert "host" not in names and "port" not in names


FISH = shutil.which("fish")


def _need_fish() -> None:
    """Skip loudly without fish (the script is still parsed below); CI must have it."""
    if FISH is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI: fish is missing (scripts/test.sh installs Debian's fish as root)")
        pytest.skip("fish is not installed: only parsed (scripts/test.sh installs it as root)")


def complete_fish(*words: str, env: dict[str, str]) -> list[str]:
    """What fish offers after ``sglang-supervisor WORDS`` (``complete -C``)."""
    _, script = run("completion", "fish")
    line = " ".join(["sglang-supervisor", *words])
    program = f"{script}\ncomplete -C {fish_quote(line)}"
    assert FISH is not None
    done = subprocess.run(
        [FISH, "--no-config", "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    return sorted(x.split("\t")[0] for x in done.stdout.splitlines())


def test_fish_completion_in_real_fish(tmp_path: Path) -> None:
    _need_fish()
    env = _shell_env()
    assert complete_fish("ap", env=env) == ["apply"]
    assert complete_fish("apply", "--dr", env=env) == ["--drain", "--dry-run"]
    assert complete_fish("serve", "--log-level", "w", env=env) == ["warning"]
    assert complete_fish("completion", "", env=env) == ["bash", "fish", "zsh"]
    assert complete_fish("operations", "", env=env) == ["follow", "list", "show"]
    assert complete_fish("apply", "--set", "mem_frac", env=env) == ["mem_fraction_static="]
    assert complete_fish("apply", "--unset", "kv_cache_d", env=env) == ["kv_cache_dtype"]
    (tmp_path / "levers.toml").write_text("")
    there = str(tmp_path / "lev")
    assert complete_fish("apply", "--file", there, env=env) == [str(tmp_path / "levers.toml")]
    with fake_daemon(["zz_from_the_daemon"]) as url:
        env = _shell_env(SGLANG_SUPERVISOR_URL=url)
        assert complete_fish("apply", "--set", "zz", env=env) == ["zz_from_the_daemon="]


def test_fish_script_parses_as_complete_lines() -> None:
    """Without fish: every line is a function line or a well-formed ``complete``."""
    _, script = run("completion", "fish")
    body = [ln for ln in script.splitlines() if ln and not ln.startswith("#")]
    assert body[:3] == [
        "function __sglang_supervisor_levers",
        "    sglang-supervisor completion --lever-names 2>/dev/null",
        "end",
    ]
    for line in body[3:]:
        words = shlex.split(line.replace("\\'", "'\"'\"'"))
        assert words[:3] == ["complete", "-c", "sglang-supervisor"], line
    assert (
        "complete -c sglang-supervisor -n '__fish_seen_subcommand_from apply' -l set -x -a "
        "'(__sglang_supervisor_levers | string replace -r \\'$\\' \\'=\\')'"
    ) in script
    commands = {ln.split(" -a ")[1].split()[0] for ln in body if "__fish_use_subcommand -a" in ln}
    assert {"apply", "operations", "completion", "rollout"} <= commands


def test_fish_quote() -> None:
    assert fish_quote("it's a \\ test") == "'it\\'s a \\\\ test'"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_lever_name_from_the_daemon_is_never_run_by_the_shell(tmp_path: Path) -> None:
    """bash's ``compgen -W`` expands the words it completes from: a daemon whose schema
    named a flag ``$(touch FILE)`` ran that command on the operator's TAB."""
    marker = tmp_path / "ran"
    hostile = [f"$(touch {marker})", f"`touch {marker}`", "zz_fine"]
    with fake_daemon(hostile) as url:
        env = _shell_env(SGLANG_SUPERVISOR_URL=url)
        assert complete_bash("apply", "--set", "", env=env) == ["zz_fine="]
        assert complete_bash("apply", "--unset", "", env=env) == ["zz_fine"]
    assert not marker.exists()
