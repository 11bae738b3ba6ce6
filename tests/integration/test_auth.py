"""No one reconfigures a GPU server without the credential; every change is audited."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import Daemon, wait_until
from tests.inprocess import api_client
from tests.unit.fakes import run

TOKEN = "s3cret-token-for-tests"


def test_token_is_required_except_on_healthz(daemon_factory: type[Daemon]) -> None:
    d = daemon_factory()
    d.env["SGLANG_SUPERVISOR_TOKEN"] = TOKEN
    d.start(wait_ready=False)
    anon = httpx.Client(base_url=d.url, timeout=10, trust_env=False)
    assert anon.get("/healthz").status_code == 200
    for method, path in [
        ("GET", "/status"),
        ("GET", "/metrics"),
        ("POST", "/levers"),
        ("POST", "/stop"),
        ("GET", "/levers/schema"),
        ("GET", "/events"),
    ]:
        r = anon.request(method, path, json={})
        assert r.status_code == 401, (path, r.status_code)
        assert r.headers["www-authenticate"].startswith("Bearer")
    wrong = anon.get("/status", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    d.client.headers["Authorization"] = f"Bearer {TOKEN}"
    d.wait_state("ready")
    # A header naming another caller is not who the audit log records.
    d.client.headers["X-Forwarded-For"] = "203.0.113.9"
    r = d.apply({"mem_fraction_static": 0.8})
    assert r.json()["operation"]["state"] == "succeeded"
    anon.close()

    # The audit log names the caller and the lever diff, refusals included (its own
    # thread writes it, moments after the answer).
    def audit_lines() -> list[dict[str, Any]]:
        text = (d.dir / "state" / "audit.log").read_text()
        return [json.loads(x) for x in text.splitlines()]

    def accepted_apply() -> list[dict[str, Any]]:
        return [x for x in audit_lines() if x["action"] == "apply" and x["outcome"] == "accepted"]

    applied = wait_until(accepted_apply, 10, 0.02, "the accepted apply in audit.log")
    lines = audit_lines()
    assert applied and applied[0]["client"].startswith("127.0.0.1:")
    assert all("203.0.113.9" not in str(x) for x in lines)
    assert applied[0]["diff"] == {"mem_fraction_static": {"old": 0.85, "new": 0.8}}
    assert any(x["action"] == "refused" for x in lines)


def test_metrics_can_be_public(tmp_path: Path) -> None:
    async def check() -> None:
        async with api_client(tmp_path, token=TOKEN, metrics_public=True, ready=False) as (
            client,
            _,
            _,
        ):
            client.headers.pop("Authorization")
            assert (await client.get("/metrics")).status_code == 200
            assert (await client.get("/status")).status_code == 401

    run(check)


def test_oversized_request_is_refused(tmp_path: Path) -> None:
    async def check() -> None:
        async with api_client(tmp_path, max_body_bytes=4096) as (client, rig, _):
            pid = (await client.get("/status")).json()["server"]["pid"]
            body = {"levers": {"served_model_name": "x" * 10_000}}
            r = await client.post("/levers", json=body)
            assert r.status_code == 413
            assert (await client.get("/status")).json()["server"]["pid"] == pid
            assert len(rig.procs.spawns) == 1  # nothing was launched

    run(check)


def _serve(
    tmp: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_supervisor_api.cli",
            "serve",
            "--simulate",
            "--state-dir",
            str(tmp / "s"),
            "--port",
            "0",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_group_readable_token_file_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o640)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[api]\ntoken_file = "{token}"\n')
    out = _serve(tmp_path, "--config", str(cfg))
    assert out.returncode == 2
    assert "chmod 600" in out.stderr and str(token) in out.stderr


def test_non_loopback_without_token_is_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_SUPERVISOR_TOKEN"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_supervisor_api.cli",
            "serve",
            "--simulate",
            "--state-dir",
            str(tmp_path / "s"),
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert out.returncode == 2
    assert "refusing to listen on 0.0.0.0 without a token" in out.stderr
