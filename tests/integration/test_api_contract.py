"""The API as a client generator and a load balancer see it: the OpenAPI document lists
every status code each route answers, with one error shape, the bearer scheme and real
media types; /readyz; Retry-After on 409; one operation envelope; /docs without a CDN."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from prometheus_client import CONTENT_TYPE_LATEST

from api.responses import Problem
from supervisor.version import version
from tests.helpers import Daemon, wait_until

TOKEN = "contract-test-token-0123456789"

#: Every route of the API and the codes it can answer (the test below makes each happen).
EXPECTED: dict[tuple[str, str], set[int]] = {
    ("get", "/healthz"): {200},
    ("get", "/readyz"): {200, 503},
    ("get", "/status"): {200, 401},
    ("get", "/levers"): {200, 401},
    ("get", "/levers/schema"): {200, 401},
    ("post", "/levers"): {200, 202, 401, 409, 413, 422},
    ("get", "/operations"): {200, 401, 422},
    ("get", "/operations/{op_id}"): {200, 401, 404},
    ("post", "/operations/{op_id}/cancel"): {200, 202, 401, 404, 409, 422},
    ("post", "/stop"): {200, 202, 401, 409, 422},
    ("post", "/start"): {200, 202, 401, 409, 422},
    ("post", "/restart"): {200, 202, 401, 409, 422},
    ("get", "/metrics"): {200, 401},
    ("get", "/logs"): {200, 401, 404, 422},
    ("get", "/events"): {200, 401, 422},
    ("post", "/plan"): {200, 401, 413, 422},
}


@pytest.fixture
def daemon(daemon_factory: type[Daemon]) -> Daemon:
    d = daemon_factory(extra={"api": {"max_request_bytes": 4096}})
    d.env["SGLANG_SUPERVISOR_TOKEN"] = TOKEN
    d.client.headers["Authorization"] = f"Bearer {TOKEN}"
    return d.start()


def documented(doc: dict[str, Any]) -> dict[tuple[str, str], set[int]]:
    return {
        (method, path): {int(code) for code in op["responses"]}
        for path, item in doc["paths"].items()
        for method, op in item.items()
    }


def test_openapi_lists_every_code_each_route_answers(daemon: Daemon) -> None:
    d = daemon
    doc = d.client.get("/openapi.json").json()
    assert documented(doc) == EXPECTED
    assert doc["info"]["version"] == version()
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": doc["components"]["securitySchemes"]["bearer"]["description"],
    }
    paths = doc["paths"]
    assert paths["/healthz"]["get"]["security"] == [] and paths["/readyz"]["get"]["security"] == []
    assert paths["/status"]["get"]["security"] == [{"bearer": []}]
    # One error shape: every 4xx/5xx of every route refers to Problem (readyz's 503 aside).
    for (method, path), codes in EXPECTED.items():
        for code in codes:
            if code >= 400 and (path, code) != ("/readyz", 503):
                content = paths[path][method]["responses"][str(code)]["content"]
                assert content["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/Problem"
                }, (method, path, code)
    models = {
        ("/status", "get", "200"): "StatusAnswer",
        ("/levers", "get", "200"): "LeversAnswer",
        ("/operations/{op_id}", "get", "200"): "OperationEnvelope",
        ("/levers", "post", "202"): "OperationEnvelope",
        ("/levers", "post", "200"): "OperationEnvelope",
        ("/operations", "get", "200"): "OperationList",
    }
    for (path, method, code), name in models.items():
        schema = paths[path][method]["responses"][code]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{name}"}, (path, code)
    assert CONTENT_TYPE_LATEST in paths["/metrics"]["get"]["responses"]["200"]["content"]
    assert "text/event-stream" in paths["/events"]["get"]["responses"]["200"]["content"]
    assert "Retry-After" in paths["/levers"]["post"]["responses"]["409"]["headers"]

    # Now make every code happen, and check each answer against the document.
    bare = httpx.Client(base_url=d.url, timeout=30, trust_env=False)
    seen: dict[tuple[str, str], set[int]] = {k: set() for k in EXPECTED}

    def call(
        method: str, route: str, url: str, client: httpx.Client = d.client, **kw: Any
    ) -> httpx.Response:
        r = client.request(method.upper(), url, **kw)
        assert r.status_code in EXPECTED[(method, route)], (method, url, r.status_code, r.text)
        seen[(method, route)].add(r.status_code)
        if r.status_code >= 400 and route != "/readyz":
            Problem.model_validate(r.json())  # the one error shape
        return r

    # 401 on every route that needs the token; the public ones answer without it.
    for method, route in EXPECTED:
        url = route.replace("{op_id}", "x")
        body = {"json": {}} if method == "post" else {}
        r = call(method, route, url, client=bare, **body)
        if route in ("/healthz", "/readyz"):
            assert r.status_code == 200
        else:
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    for route in ("/healthz", "/status", "/levers", "/levers/schema", "/metrics", "/operations"):
        call("get", route, route)
    assert d.client.get("/healthz").json()["version"] == version()
    assert d.client.get("/status").json()["version"] == version()
    assert d.client.get("/metrics").headers["content-type"] == CONTENT_TYPE_LATEST
    call("get", "/readyz", "/readyz")
    call("get", "/operations", "/operations", params={"limit": 0})  # 422
    call("get", "/operations/{op_id}", "/operations/nope")  # 404
    call("get", "/logs", "/logs", params={"tail": 5})
    call("get", "/logs", "/logs", params={"launch": 999})  # 404
    call("get", "/logs", "/logs", params={"tail": -1})  # 422
    call("post", "/levers", "/levers", json={"levers": {"no_such_flag": 1}})  # 422
    call("post", "/levers", "/levers", json={"levers": {}, "bogus": 1})  # 422
    call(
        "post",
        "/levers",
        "/levers",
        content=b"{" + b" " * 5000 + b"}",
        headers={"content-type": "application/json"},
    )  # 413
    call(
        "post",
        "/plan",
        "/plan",
        content=b"{" + b" " * 5000 + b"}",
        headers={"content-type": "application/json"},
    )  # 413
    call("post", "/plan", "/plan", json={"gpus": "many"})  # 422
    call(
        "post", "/levers", "/levers", json={"levers": {"mem_fraction_static": 0.8}, "dry_run": True}
    )  # 200
    for route in ("/stop", "/start", "/restart"):
        call("post", route, route, params={"wait": "maybe"})  # 422
    with d.client.stream("GET", "/events", params={"replay": "nope"}) as r:
        assert r.status_code == 422
        seen[("get", "/events")].add(422)
    with d.client.stream("GET", "/events") as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        seen[("get", "/events")].add(200)

    # A slow apply: 202, then 409 (with Retry-After) on every operation route, /readyz 503.
    accepted = call(
        "post",
        "/levers",
        "/levers",
        json={"levers": {"mem_fraction_static": 0.86}, "env": {"SGLANG_SIM_STARTUP_S": "3"}},
    )
    assert accepted.status_code == 202
    op_id = accepted.json()["operation"]["id"]
    for route in ("/levers", "/stop", "/start", "/restart"):
        r = call(
            "post",
            route,
            route,
            json={"levers": {"mem_fraction_static": 0.8}} if route == "/levers" else None,
        )
        assert r.status_code == 409 and r.headers["retry-after"].isdigit(), r
        assert r.json()["detail"]["operation"] == op_id
    wait_until(lambda: d.client.get("/readyz").status_code == 503, 20, 0.05, "readyz 503")
    seen[("get", "/readyz")].add(503)
    r503 = bare.get("/readyz").json()
    assert r503["ready"] is False and r503["state"] != "ready"
    d.wait_state("ready")
    # GET /operations/{id} answers in the POST's envelope.
    got = call("get", "/operations/{op_id}", f"/operations/{op_id}").json()
    assert set(got) == {"operation"} and got["operation"]["id"] == op_id
    assert got["operation"]["state"] == "succeeded"
    listed = call("get", "/operations", "/operations", params={"limit": 2}).json()["operations"]
    assert listed[0]["id"] == op_id and len(listed) == 2  # newest first

    # Cancel: unknown 404, ended 409, a running one 202 (200 with ?wait=true), bad wait 422.
    cancel = "/operations/{op_id}/cancel"
    call("post", cancel, "/operations/nope/cancel")
    ended = call("post", cancel, f"/operations/{op_id}/cancel")
    assert ended.status_code == 409 and ended.json()["detail"]["operation"]["id"] == op_id
    call("post", cancel, f"/operations/{op_id}/cancel", params={"wait": "maybe"})
    for wait in ("false", "true"):
        slow = d.apply(
            {"mem_fraction_static": 0.87}, env={"SGLANG_SIM_STARTUP_S": "5"}, wait=False
        ).json()["operation"]
        wait_until(lambda: d.status()["state"] == "starting", 20, 0.05, "the slow start")
        r = call("post", cancel, f"/operations/{slow['id']}/cancel", params={"wait": wait})
        assert r.status_code == (200 if wait == "true" else 202), r.text
        d.wait_state("ready")

    # 200 with ?wait=true, 202 without, for stop/start/restart.
    assert call("post", "/restart", "/restart", params={"wait": "true"}).status_code == 200
    assert call("post", "/stop", "/stop").status_code == 202
    d.wait_state("stopped")
    assert call("post", "/start", "/start", params={"wait": "true"}).status_code == 200
    assert call("post", "/stop", "/stop", params={"wait": "true"}).status_code == 200
    assert call("post", "/start", "/start").status_code == 202
    d.wait_state("ready")
    assert call("post", "/restart", "/restart").status_code == 202
    d.wait_state("ready")
    call("post", "/plan", "/plan", json={})

    never = {k: sorted(EXPECTED[k] - v) for k, v in seen.items() if EXPECTED[k] - v}
    assert not never, f"documented but never answered: {never}"


def test_docs_page_needs_no_cdn_and_no_token(daemon: Daemon) -> None:
    bare = httpx.Client(base_url=daemon.url, timeout=10, trust_env=False)
    for path in ("/docs", "/", "/ui"):
        r = bare.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "connect-src 'self'" in r.headers["content-security-policy"]
        # Nothing loaded from elsewhere: no external src/href at all.
        assert not re.findall(r"(?:src|href)=[\"']?(?:https?:)?//", r.text), path
    assert bare.get("/openapi.json").status_code == 200
