"""Which key SGLang 0.5.23 wants on which endpoint (``sglang_supervisor.sglang.auth``),
held to SGLang's own code: its route levels read from ``srt/entrypoints/http_server.py``'s
``@auth_level`` decorators, and its ``decide_request_auth`` (``srt/utils/auth.py:74-150``)
run in the parser environment on every case, where that environment exists."""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path

import pytest

from sglang_supervisor.sglang import auth
from sglang_supervisor.sglang.auth import ServerKeys

SGLANG_PYTHON = os.environ.get("SGLANG_SUPERVISOR_TEST_SGLANG_PYTHON")
BOTH = ServerKeys(api_key="user-key", admin_api_key="admin-key")

CASES = [
    # (keys, method, path, the key expected)
    (BOTH, "GET", "/health_generate", None),
    (BOTH, "GET", "/metrics", None),
    (BOTH, "GET", "/server_info", "user-key"),  # normal: api_key, even beside an admin key
    (BOTH, "POST", "/set_internal_state", "admin-key"),  # admin: api_key not accepted
    (BOTH, "PUT", "/hicache/storage-backend", "admin-key"),
    (BOTH, "GET", "/hicache/storage-backend", "admin-key"),
    (BOTH, "GET", "/model_info", "user-key"),
    (ServerKeys(api_key="user-key"), "POST", "/update_weights_from_disk", "user-key"),
    (ServerKeys(admin_api_key="admin-key"), "GET", "/server_info", None),
    (ServerKeys(admin_api_key="admin-key"), "POST", "/load_lora_adapter", "admin-key"),
    (ServerKeys(), "POST", "/set_internal_state", None),
]


@pytest.mark.parametrize(("keys", "method", "path", "want"), CASES)
def test_the_key_each_route_takes(
    keys: ServerKeys, method: str, path: str, want: str | None
) -> None:
    assert auth.expected_key(keys, method, path) == want
    assert auth.allowed(keys, method, path, f"Bearer {want}" if want else None)
    if want is not None:
        assert not auth.allowed(keys, method, path, None)
        assert not auth.allowed(keys, method, path, "Bearer wrong")
        other = "user-key" if want == "admin-key" else "admin-key"
        assert not auth.allowed(keys, method, path, f"Bearer {other}")


def _sglang_file(rel: str) -> Path:
    assert SGLANG_PYTHON
    out = subprocess.run(
        [SGLANG_PYTHON, "-c", "import sglang, os; print(os.path.dirname(sglang.__file__))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return Path(out.stdout.strip()) / rel


@pytest.mark.skipif(not SGLANG_PYTHON, reason="needs SGLang (SGLANG_SUPERVISOR_TEST_SGLANG_PYTHON)")
def test_the_admin_routes_are_sglangs() -> None:
    """Every route SGLang declares ADMIN_OPTIONAL that this daemon calls or the simulator
    answers is in the table, and the table names no route SGLang declares otherwise."""
    tree = ast.parse(_sglang_file("srt/entrypoints/http_server.py").read_text())
    admin: set[tuple[str, str]] = set()
    other: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef):
            continue
        routes: list[tuple[str, str]] = []
        level = "NORMAL"
        for dec in node.decorator_list:
            if not isinstance(dec, ast.Call):
                continue
            name = getattr(dec.func, "attr", None) or getattr(dec.func, "id", None)
            if name == "auth_level" and dec.args:
                level = getattr(dec.args[0], "attr", "NORMAL")
            elif name in ("get", "post", "put", "delete", "api_route") and dec.args:
                path = getattr(dec.args[0], "value", None)
                methods = [name.upper()]
                for kw in dec.keywords:
                    if kw.arg == "methods" and isinstance(kw.value, ast.List):
                        methods = [str(getattr(e, "value", "")) for e in kw.value.elts]
                if isinstance(path, str):
                    routes += [(m, path) for m in methods]
        (admin if level == "ADMIN_OPTIONAL" else other).update(routes)
    ours = {(m, p) for m, p in admin | other if p in auth.ADMIN_OPTIONAL_PATHS}
    missing = set(auth.ADMIN_OPTIONAL_PATHS) - {p for _, p in admin}
    assert not missing, f"not ADMIN_OPTIONAL routes of SGLang: {sorted(missing)}"
    assert ours <= admin, f"declared otherwise by SGLang: {sorted(ours - admin)}"
    called = {"/set_internal_state", "/configure_logging", "/load_lora_adapter"}
    called |= {"/unload_lora_adapter", "/update_weights_from_disk"}
    assert {p for _, p in admin} >= called
    assert ("GET", "/server_info") in other and ("GET", "/model_info") in other


@pytest.mark.skipif(not SGLANG_PYTHON, reason="needs SGLang (SGLANG_SUPERVISOR_TEST_SGLANG_PYTHON)")
def test_sglangs_own_decision_agrees_on_every_case() -> None:
    """``decide_request_auth`` itself (srt/utils/auth.py:74), on each case and each header."""
    program = """
import json, sys
from sglang.srt.utils.auth import AuthLevel, decide_request_auth
out = []
for c in json.load(sys.stdin):
    d = decide_request_auth(method=c["method"], path=c["path"], authorization_header=c["header"],
        api_key=c["api_key"], admin_api_key=c["admin_api_key"], auth_level=AuthLevel[c["level"]])
    out.append(d.allowed)
print(json.dumps(out))
"""
    cases, ours = [], []
    for keys, method, path, _ in CASES:
        level = "ADMIN_OPTIONAL" if path in auth.ADMIN_OPTIONAL_PATHS else "NORMAL"
        for header in (None, "Bearer user-key", "Bearer admin-key", "Bearer wrong"):
            cases.append(
                {
                    "method": method,
                    "path": path,
                    "header": header,
                    "api_key": keys.api_key,
                    "admin_api_key": keys.admin_api_key,
                    "level": level,
                }
            )
            ours.append(auth.allowed(keys, method, path, header))
    assert SGLANG_PYTHON
    r = subprocess.run(
        [SGLANG_PYTHON, "-c", program],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(r.stdout.strip().splitlines()[-1]) == ours


def test_the_keys_never_show_in_a_repr() -> None:
    shown = repr(BOTH) + str(BOTH)
    assert "user-key" not in shown and "admin-key" not in shown, shown
