"""The ``sglang-supervisor`` client commands, run as a real process against a real daemon.

Each test asserts what an operator sees: the exit code, the phases in order, the reason
for a rollback, the lever the daemon refused, one line (never a traceback) when nothing
answers. The value parsing of ``--set`` and the client's HTTP details are unit-tested at
the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sglang_supervisor_api.cli.client import Client
from sglang_supervisor_api.cli.client_errors import Unauthorized
from sglang_supervisor_api.cli.event_stream import open_event_stream
from sglang_supervisor_api.cli.follow import SeqFilter
from sglang_supervisor_api.cli.levers_input import lever_changes_from_args, parse_value
from sglang_supervisor_api.cli.main import build_parser
from sglang_supervisor_api.cli.server_log import new_lines
from tests.helpers import Daemon, free_port, proc_state, wait_until

REPO = Path(__file__).resolve().parents[2]
TOKEN = "cli-test-token-0123456789"
PHASES = ["validate", "preflight", "stop", "release", "start", "probation", "commit"]


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SGLANG_SUPERVISOR_URL", "SGLANG_SUPERVISOR_TOKEN", "COLUMNS")
    }
    env["COLUMNS"] = "160"
    env.update(extra)
    return env


def cli(
    d: Daemon | None, *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m sglang_supervisor_api.cli ARGS --url <daemon>`` and capture what it
    prints."""
    url = ["--url", d.url] if d is not None else []
    return subprocess.run(
        [sys.executable, "-m", "sglang_supervisor_api.cli", *args, *url],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env or _env(),
        check=False,
    )


class Running:
    """A CLI process that runs until interrupted; its stdout lines are collected."""

    def __init__(self, d: Daemon, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_supervisor_api.cli", *args, "--url", d.url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env or _env(),
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pred: Callable[[str], bool], what: str, timeout: float = 20) -> str:
        def found() -> str | None:
            if self.proc.poll() is not None and not any(pred(x) for x in self.lines):
                raise AssertionError(f"exited {self.proc.returncode} before {what}")
            return next((x for x in self.lines if pred(x)), None)

        return str(wait_until(found, timeout, 0.05, what))

    def interrupt(self) -> tuple[int, str]:
        """Ctrl-C; returns the exit code and stderr."""
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            state = proc_state(self.proc.pid)
            raise AssertionError(f"no exit 10 s after SIGINT: {state}") from None
        self._reader.join(5)
        return self.proc.returncode, err


@pytest.fixture
def daemon(daemon_factory: type[Daemon]) -> Iterator[Daemon]:
    yield daemon_factory().start()


def _phase_order(stdout: str) -> list[str]:
    """Phase names in the order their end lines were printed."""
    names = []
    for line in stdout.splitlines():
        parts = line.split()
        is_phase = len(parts) >= 3 and parts[0].startswith("+") and parts[1] != "gpu"
        if is_phase and parts[2] != "started":
            names.append(parts[1])
    return names


# ------------------------------------------------------------------ end to end


def test_status_levers_and_schema(readonly_daemon: Daemon) -> None:
    daemon = readonly_daemon
    r = cli(daemon, "status")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("state       ready for ")
    assert "backend     simulated" in out
    pid = daemon.status()["server"]["pid"]
    assert f"pid {pid}" in out and "max_total_num_tokens" in out
    assert "mem_fraction_static  0.85" in out
    assert "GPU  USED       TOTAL      USE  MEMBERS  FOREIGN" in out
    assert "0    119.3 GiB  140.4 GiB  85%  1        0" in out  # simulated H200, one rank each

    r = cli(daemon, "status", "--json")
    assert r.returncode == 0 and r.stderr == ""
    assert json.loads(r.stdout)["state"] == "ready"

    r = cli(daemon, "levers")
    assert r.returncode == 0
    assert r.stdout.splitlines()[0].split() == ["LEVER", "CURRENT", "LAST-GOOD"]
    assert "mem_fraction_static  0.85       0.85" in r.stdout

    r = cli(daemon, "schema", "mem_fraction")
    assert r.returncode == 0
    assert "mem_fraction_static  --mem-fraction-static  float" in r.stdout
    assert "out-of-memory" in r.stdout  # the help text, wrapped
    r = cli(daemon, "schema", "kv_cache_dtype", "--json")
    flags = {f["dest"]: f for f in json.loads(r.stdout)["flags"]}
    assert "fp8_e4m3" in flags["kv_cache_dtype"]["choices"]
    assert cli(daemon, "schema", "no_such_flag_anywhere").returncode == 1


def test_apply_shows_phases_in_order_and_sends_typed_values(daemon: Daemon, tmp_path: Path) -> None:
    r = cli(
        daemon,
        "apply",
        "--set",
        "mem_fraction_static=0.9",
        "--set",
        "enable_hierarchical_cache=true",
        "--set",
        "hicache_size=30",
        "--env",
        "NCCL_DEBUG=INFO",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert _phase_order(r.stdout) == PHASES
    assert "mem_fraction_static 0.85 -> 0.9" in r.stdout.splitlines()[0]
    assert "gpu memory used (GiB)" in r.stdout  # release samples
    assert "The server is fired up and ready to roll!" in r.stdout  # the new server's log
    assert "succeeded in" in r.stdout
    s = daemon.status()
    assert s["levers"]["mem_fraction_static"] == 0.9
    assert s["levers"]["enable_hierarchical_cache"] is True
    assert s["levers"]["hicache_size"] == 30
    assert s["env"] == {"NCCL_DEBUG": "INFO"}

    # A levers file; --set wins over it; --poll follows without the event stream.
    path = tmp_path / "levers.toml"
    path.write_text(
        '[levers]\nmem_fraction_static = 0.88\nkv_cache_dtype = "fp8_e4m3"\n'
        'max_running_requests = 64\n\n[env]\nNCCL_DEBUG = "WARN"\n'
    )
    r = cli(daemon, "apply", "--file", str(path), "--set", "max_running_requests=128", "--poll")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [p for p in _phase_order(r.stdout) if p in PHASES][-1] == "commit"
    s = daemon.status()
    assert s["levers"]["mem_fraction_static"] == 0.88
    assert s["levers"]["kv_cache_dtype"] == "fp8_e4m3"
    assert s["levers"]["max_running_requests"] == 128
    assert s["env"] == {"NCCL_DEBUG": "WARN"}

    # A dry run touches nothing and says what would change.
    pid = s["server"]["pid"]
    r = cli(daemon, "apply", "--dry-run", "--set", "mem_fraction_static=0.8")
    assert r.returncode == 0
    assert "would change: mem_fraction_static 0.88 -> 0.8" in r.stdout
    assert daemon.status()["server"]["pid"] == pid


def test_oom_rolls_back_with_exit_3_and_the_reason(daemon: Daemon) -> None:
    r = cli(daemon, "apply", "--set", "mem_fraction_static=0.99")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "rolled back after" in r.stdout
    assert "CUDA out of memory" in r.stdout
    assert "rollback_start" in r.stdout
    assert daemon.status()["levers"]["mem_fraction_static"] == 0.85

    r = cli(daemon, "apply", "--set", "mem_fraction_static=0.99", "--json")
    assert r.returncode == 3
    op = json.loads(r.stdout)
    assert op["state"] == "rolled_back" and "out of memory" in op["rollback_reason"]


def test_invalid_lever_exits_2_and_names_it(readonly_daemon: Daemon) -> None:
    daemon = readonly_daemon
    pid = daemon.status()["server"]["pid"]
    r = cli(daemon, "apply", "--set", "mem_fraction=0.9", "--set", "kv_cache_dtype=fp9")
    assert r.returncode == 2
    assert r.stdout == ""
    assert "mem_fraction: unknown lever" in r.stderr
    assert "did you mean mem_fraction_static" in r.stderr
    assert "kv_cache_dtype:" in r.stderr and "fp9" in r.stderr
    assert "Traceback" not in r.stderr
    r = cli(daemon, "apply", "--set", "mem_fraction=0.9", "--json")
    assert r.returncode == 2
    assert json.loads(r.stdout)["detail"]["problems"][0]["lever"] == "mem_fraction"
    assert cli(daemon, "apply").returncode == 2  # nothing to apply
    assert daemon.status()["server"]["pid"] == pid


def test_second_apply_while_one_runs_exits_5(daemon: Daemon) -> None:
    # A slow start keeps the first operation running while the second is refused.
    r = cli(daemon, "apply", "--env", "SGLANG_SIM_STARTUP_S=6", "--force-restart", "--no-wait")
    assert r.returncode == 0, r.stderr
    first = r.stdout.split()[1].rstrip(":")
    assert daemon.status()["operation"]["id"] == first
    r = cli(daemon, "apply", "--set", "max_running_requests=100")
    assert r.returncode == 5, r.stdout + r.stderr
    assert f"busy: apply {first} running" in r.stderr
    assert cli(daemon, "stop").returncode == 5
    daemon.wait_state("ready")


def test_stop_then_start(daemon: Daemon) -> None:
    r = cli(daemon, "stop")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _phase_order(r.stdout) == ["stop", "release"]
    s = daemon.status()
    assert s["state"] == "stopped"
    assert all(g["memory_used_bytes"] == 0 for g in s["gpus"])
    r = cli(daemon, "start")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _phase_order(r.stdout)[-2:] == ["start", "commit"]
    assert daemon.status()["state"] == "ready"


def test_unreachable_daemon_is_one_line_exit_1() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for args in (("status",), ("apply", "--set", "mem_fraction_static=0.9"), ("logs", "-f")):
        r = cli(None, *args, "--url", url)
        assert r.returncode == 1, (args, r.stderr)
        assert r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        assert url in lines[0] and "is it running?" in lines[0]
    # The URL also comes from the environment.
    r = cli(None, "status", env=_env(SGLANG_SUPERVISOR_URL=url))
    assert r.returncode == 1 and url in r.stderr


def test_token_from_option_file_or_environment(
    daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    d = daemon_factory()
    d.env = {"SGLANG_SUPERVISOR_TOKEN": TOKEN}
    d.client.headers["Authorization"] = f"Bearer {TOKEN}"
    d.start()
    r = cli(d, "status")
    assert r.returncode == 6  # the token: its own exit code (issue 27 §8)
    assert "wants a token" in r.stderr and "Traceback" not in r.stderr
    assert cli(d, "status", "--token", "wrong").returncode == 6
    assert cli(d, "status", "--token", TOKEN).returncode == 0
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    assert cli(d, "levers", "--token-file", str(token_file)).returncode == 0
    r = cli(d, "restart", env=_env(SGLANG_SUPERVISOR_TOKEN=TOKEN))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "start " in r.stdout and "succeeded in" in r.stdout


def test_logs_and_events_follow_until_ctrl_c(daemon: Daemon) -> None:
    r = cli(daemon, "logs", "-n", "5")
    assert r.returncode == 0
    assert 0 < len(r.stdout.splitlines()) <= 5
    r = cli(daemon, "logs", "--launch", "99")
    assert r.returncode == 7 and "no log of launch 99" in r.stderr  # not found

    logs = Running(daemon, "logs", "-f", "-n", "1")
    # --replay: the restart below shows even if it comes before the stream is open.
    events = Running(daemon, "events", "--replay")
    pid = daemon.status()["server"]["pid"]
    wait_until(lambda: logs.lines, 10, 0.05, "the first log line")
    # A restart shows in both: its events, and the new launch's log lines.
    op_id: str | None = None

    def restarted() -> bool:
        nonlocal op_id
        if op_id is None:
            r = daemon.client.post("/restart")
            assert r.status_code == 202, r.text
            op_id = r.json()["operation"]["id"]
        return any(f"{op_id} restart succeeded" in x for x in events.lines)

    wait_until(restarted, 30, 0.1, "the restart in the event stream")
    kinds = [x.split()[1] for x in events.lines if op_id and op_id in x]
    assert {"operation", "phase", "release_sample"} <= set(kinds)
    logs.wait_for(lambda x: x.startswith("--- a new launch"), "the new launch's banner")
    banner = next(i for i, x in enumerate(logs.lines) if x.startswith("--- a new launch"))
    logs.wait_for(lambda x: "fired up and ready to roll" in x, "the new launch's log")
    assert any("fired up and ready to roll" in x for x in logs.lines[banner:])
    assert daemon.status()["server"]["pid"] != pid
    for proc in (logs, events):
        code, err = proc.interrupt()
        assert code == 0, err
        assert "Traceback" not in err


# ------------------------------------------------------------------ units


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("0.9", 0.9),
        ("8", 8),
        ("-1", -1),
        ("1_000", 1000),
        ("1e3", 1000.0),
        ("true", True),
        ("false", False),
        ('"0.9"', "0.9"),
        ("'true'", "true"),
        ('""', ""),
        ("", ""),
        ("fp8_e4m3", "fp8_e4m3"),
        ("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-70B-Instruct"),
        ("/models/llama 70b", "/models/llama 70b"),
        ("True", "True"),
        ("inf", "inf"),
        ("nan", "nan"),
        ("2024-01-01", "2024-01-01"),
        ("[1, 2, 4]", [1, 2, 4]),
        ("{a = 1}", "{a = 1}"),
        ("1\nx = 2", "1\nx = 2"),
    ],
)
def test_set_values_read_like_toml_scalars(raw: str, value: Any) -> None:
    got = parse_value(raw)
    assert got == value and type(got) is type(value)


def test_apply_arguments_merge_file_then_options(tmp_path: Path) -> None:
    path = tmp_path / "l.toml"
    path.write_text('[levers]\n"mem-fraction-static" = 0.8\ntp_size = 8\n[env]\nNCCL_DEBUG = 1\n')
    args = build_parser().parse_args(
        [
            "apply",
            "--file",
            str(path),
            "--set",
            "mem-fraction-static=0.9",
            "--set",
            "served_model_name=",
            "--env",
            "SGLANG_X=a=b",
            "--unset",
            "tp_size",
            "--unset",
            "env.NCCL_DEBUG",
        ]
    )
    levers, env = lever_changes_from_args(args)
    assert levers == {"mem_fraction_static": 0.9, "tp_size": None, "served_model_name": ""}
    assert env == {"NCCL_DEBUG": None, "SGLANG_X": "a=b"}

    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nport = 1\n")
    r = cli(None, "apply", "--file", str(bad), "--url", "http://127.0.0.1:1")
    assert r.returncode == 2 and "unexpected server" in r.stderr
    r = cli(None, "apply", "--set", "novalue", "--url", "http://127.0.0.1:1")
    assert r.returncode == 2 and "expected NAME=VALUE" in r.stderr


def test_new_log_lines_after_overlap() -> None:
    assert new_lines([], ["a", "b"]) == ["a", "b"]
    assert new_lines(["a", "b", "c"], ["b", "c", "d", "e"]) == ["d", "e"]
    assert new_lines(["x", "x"], ["x", "x", "x"]) == ["x"]
    assert new_lines(["a", "b"], ["a", "b"]) == []
    assert new_lines(["a", "b"], ["c", "d"]) == ["c", "d"]  # no overlap: a new file


def test_replayed_events_are_dropped_but_a_restarted_daemon_is_not() -> None:
    f = SeqFilter()
    assert f.fresh({"seq": 5, "time": 100.0})
    assert not f.fresh({"seq": 4, "time": 99.0})
    assert not f.fresh({"seq": 5, "time": 100.0})
    assert f.fresh({"seq": 6, "time": 101.0})
    assert f.fresh({"seq": 1, "time": 200.0})  # numbering restarted with the daemon


def test_client_sends_the_bearer_token_and_reads_server_sent_events() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        if request.url.path == "/events":
            body = (
                b': hello\n\nevent: transition\ndata: {"seq": 1, "kind": "transition"}\n\n'
                b'data: not json\n\ndata: {"seq": 2,\ndata:  "kind": "phase"}\n\n'
            )
            return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return httpx.Response(401, json={"detail": {"message": "a bearer token is required"}})
        return httpx.Response(200, json={"state": "ready"})

    transport = httpx.MockTransport(handler)
    with Client("127.0.0.1:9", token=TOKEN, transport=transport) as c:
        assert c.url == "http://127.0.0.1:9"
        assert c.status() == {"state": "ready"}
        with open_event_stream(c) as stream:
            assert [e["kind"] for e in stream] == ["transition", "phase"]
    assert seen == [f"Bearer {TOKEN}"] * 2
    with Client("http://127.0.0.1:9", transport=transport) as c, pytest.raises(Unauthorized):
        c.status()


def test_probe_lines_are_not_shown_as_the_servers_log() -> None:
    from sglang_supervisor_api.cli.server_log import is_probe_noise

    assert is_probe_noise('[t] INFO:     127.0.0.1:1 - "GET /health_generate HTTP/1.1" 503 X')
    assert not is_probe_noise("[t TP0] torch.OutOfMemoryError: CUDA out of memory.")
