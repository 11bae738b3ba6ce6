"""The read-only token ([api] read_token_file): Prometheus and dashboards read everything,
change nothing; the audit log names which token acted. Through a real ``serve --simulate``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from fastapi.routing import iter_route_contexts

from sglang_supervisor.config import load_settings
from sglang_supervisor_api.app import create_app
from tests.helpers import Daemon, serve_refusal, wait_until
from tests.unit.fakes import make_rig

ADMIN = "admin-token-for-read-token-tests"
READ = "read-only-token-for-prometheus"
#: POST routes that change nothing: the read-only token may call them (docs/api.md).
READ_ONLY_POSTS = {"/plan"}


def _secret(path: Path, value: str, mode: int = 0o600) -> Path:
    path.write_text(value + "\n")
    path.chmod(mode)
    return path


def app_routes(tmp: Path) -> list[tuple[str, str]]:
    """Every (method, path) the daemon's app serves, from ``app.routes`` itself: a route
    added later is in this list without anyone updating the test."""
    app = create_app(make_rig(tmp).sup)
    out = []
    # FastAPI >= 0.165 keeps an included router as one entry of app.routes: its own
    # iterator gives every route of the app, as the OpenAPI document does.
    for route in iter_route_contexts(app.routes):
        for method in sorted(route.methods or ()):
            out.append((method, route.path))
    assert ("POST", "/stop") in out and ("GET", "/status") in out  # the list is the real one
    return out


def _read_token_daemon(daemon_factory: type[Daemon], tmp: Path) -> Daemon:
    admin = _secret(tmp / "admin.token", ADMIN)
    read = _secret(tmp / "read.token", READ)
    d = daemon_factory(extra={"api": {"token_file": str(admin), "read_token_file": str(read)}})
    d.client.headers["Authorization"] = f"Bearer {ADMIN}"
    return d.start()


def _audit(d: Daemon) -> list[dict[str, Any]]:
    path = d.dir / "state" / "audit.log"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_read_token_reads_everything_and_changes_nothing(
    daemon_factory: type[Daemon], tmp_path: Path
) -> None:
    d = _read_token_daemon(daemon_factory, tmp_path)
    # The admin token still changes things: an operation to read back, a launch log.
    applied = d.apply({"mem_fraction_static": 0.8})
    assert applied.status_code == 200, applied.text
    op_id = applied.json()["operation"]["id"]
    before = d.status()
    reader = httpx.Client(
        base_url=d.url,
        timeout=30,
        trust_env=False,
        headers={"Authorization": f"Bearer {READ}", "Content-Type": "application/json"},
    )
    refused, read = [], []
    for method, template in app_routes(tmp_path / "routes"):
        path = template.replace("{op_id}", op_id)
        if method in ("GET", "HEAD"):
            if path == "/events":  # a stream: the answer's status is the point
                with reader.stream("GET", path) as r:
                    assert r.status_code == 200, (path, r.status_code)
            else:
                r = reader.request(method, path)
                assert r.status_code == 200, (method, path, r.status_code, r.text[:300])
            read.append(path)
        elif method == "POST" and template in READ_ONLY_POSTS:
            r = reader.post(path, json={})
            admin = d.client.post(path, json={})
            assert r.status_code == admin.status_code != 403, (path, r.text[:300])
        else:
            r = reader.request(method, path, json={})
            assert r.status_code == 403, (method, path, r.status_code, r.text[:300])
            message = r.json()["detail"]["message"]
            assert message.startswith("this token can only read;"), message
            assert f"{method} {path}" in message and "read_token_file" in message
            refused.append(f"{method} {path}")
    assert {"/status", "/metrics", "/events", "/operations", "/levers", "/logs"} <= set(read)
    assert {"/levers/schema", f"/operations/{op_id}", "/"} <= set(read)
    assert {"POST /levers", "POST /stop", "POST /start", "POST /restart"} <= set(refused)
    assert f"POST /operations/{op_id}/cancel" in refused
    # Nothing changed: the same server, the same levers, no new operation.
    after = d.status()
    assert after["server"]["pid"] == before["server"]["pid"]
    assert after["levers"] == before["levers"] and after["state"] == "ready"
    assert after["last_operation"]["id"] == op_id

    # The audit log names which token acted: the admin's apply, the read token's refusals.
    def audited() -> list[dict[str, Any]] | None:
        lines = _audit(d)
        refusals = [x for x in lines if x["action"] == "refused" and x["token"] == "read"]
        return lines if len(refusals) >= len(refused) else None

    lines = wait_until(audited, 10, 0.02, "the read token's refusals in audit.log")
    apply = [x for x in lines if x["action"] == "apply" and x.get("outcome") == "accepted"]
    assert [x["token"] for x in apply] == ["admin"]
    stops = [x for x in lines if x["path"] == "/stop"]
    assert stops and all(x["token"] == "read" and x["action"] == "refused" for x in stops)
    # A wrong token is refused as before (401), audited as no token.
    wrong = reader.get("/status", headers={"Authorization": "Bearer not-a-token"})
    assert wrong.status_code == 401
    wait_until(
        lambda: [x for x in _audit(d) if x["action"] == "refused" and x["token"] == "none"],
        10,
        0.02,
        "the wrong token's refusal in audit.log",
    )
    reader.close()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SGLANG_SUPERVISOR_URL", "SGLANG_SUPERVISOR_TOKEN", "COLUMNS")
    }
    return subprocess.run(
        [sys.executable, "-m", "sglang_supervisor_api.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **(env or {})},
        check=False,
    )


def test_cli_with_the_read_token(daemon_factory: type[Daemon], tmp_path: Path) -> None:
    d = _read_token_daemon(daemon_factory, tmp_path)
    pid = d.status()["server"]["pid"]
    read_file = str(tmp_path / "read.token")
    out = _cli("status", "--url", d.url, "--token-file", read_file, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["state"] == "ready"
    stop = _cli("stop", "--url", d.url, "--token-file", read_file)
    assert stop.returncode != 0
    assert "this token can only read" in stop.stderr and "POST /stop" in stop.stderr
    assert "Traceback" not in stop.stderr and len(stop.stderr.strip().splitlines()) == 1
    assert d.status()["server"]["pid"] == pid and d.status()["state"] == "ready"


def test_unsafe_read_tokens_are_refused_at_start(tmp_path: Path) -> None:
    admin = _secret(tmp_path / "admin.token", ADMIN)
    # The same reader as the main token: group-readable is refused, naming the file.
    loose = _secret(tmp_path / "read.token", READ, mode=0o640)
    code, err = serve_refusal(
        tmp_path, f'[api]\ntoken_file = "{admin}"\nread_token_file = "{loose}"\n'
    )
    assert code == 2 and f"chmod 600 {loose}" in err and "read token file" in err, err
    # A read-only token without the main token would limit nothing.
    code, err = serve_refusal(tmp_path, "[api]\n", env={"SGLANG_SUPERVISOR_READ_TOKEN": READ})
    assert code == 2 and "read-only token is set" in err and "no token" in err, err
    # Equal to the main token: which one acted could not be told apart.
    code, err = serve_refusal(
        tmp_path,
        f'[api]\ntoken_file = "{admin}"\n',
        env={"SGLANG_SUPERVISOR_READ_TOKEN": ADMIN},
    )
    assert code == 2 and "the same as the token" in err, err


def test_sighup_rotates_the_read_token(daemon_factory: type[Daemon], tmp_path: Path) -> None:
    d = _read_token_daemon(daemon_factory, tmp_path)
    assert d.proc is not None

    def status_with(token: str) -> int:
        r = d.client.get("/status", headers={"Authorization": f"Bearer {token}"})
        return r.status_code

    assert status_with(READ) == 200
    _secret(tmp_path / "read.token", "the-next-read-only-token")
    d.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: status_with(READ) == 401, 20, 0.05, "the old read token refused")
    assert status_with("the-next-read-only-token") == 200
    assert status_with(ADMIN) == 200  # the main token did not change
    # A read token that became unsafe is not taken: the new one stays, the log says why.
    (tmp_path / "read.token").chmod(0o644)
    d.proc.send_signal(signal.SIGHUP)
    kept = "the token stays as it was, and the read-only one too"
    wait_until(lambda: kept in d.log(), 20, 0.05, "the refusal")
    assert "chmod 600" in d.log()
    assert status_with("the-next-read-only-token") == 200


def test_shipped_prometheus_config_holds_the_read_token() -> None:
    """deploy/prometheus/prometheus.yml copies the example config's read_token_file to
    Prometheus, never its token_file: the credential a Prometheus server keeps cannot
    restart the GPU server."""
    root = Path(__file__).resolve().parents[2]
    example = load_settings(root / "deploy" / "config.example.toml", {})
    scrape = (root / "deploy" / "prometheus" / "prometheus.yml").read_text()
    assert example.api.read_token_file and example.api.token_file
    assert re.findall(r"credentials_file: (\S+)", scrape) == [
        "/etc/prometheus/sglang-supervisor-read.token"
    ]
    copied = re.findall(r"install .*-m 0400 (\S+) \\\n#\s+(\S+)", scrape)
    assert copied == [(example.api.read_token_file, "/etc/prometheus/sglang-supervisor-read.token")]
    assert example.api.token_file not in scrape
