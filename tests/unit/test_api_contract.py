"""The API as a client generator and a load balancer see it: the OpenAPI document lists
every status code each route answers, with one error shape, the bearer scheme and real
media types; /readyz; Retry-After on 409; one operation envelope; /docs without a CDN.

In-process (``tests.inprocess``): the app over a Supervisor on fakes answers exactly what
the daemon's does; a real daemon would add only minutes of waiting on simulated starts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST

from sglang_supervisor.states import ServerState
from sglang_supervisor.version import version
from sglang_supervisor_api.app import close_streams
from sglang_supervisor_api.responses import Problem
from tests.inprocess import api_client
from tests.unit.fakes import Behaviour, Rig, run, until

TOKEN = "contract-test-token-0123456789"
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}

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
    ("post", "/reconcile"): {200, 202, 401, 409, 413, 422},
    ("get", "/metrics"): {200, 401},
    ("get", "/history"): {200, 401, 422},
    ("get", "/logs"): {200, 401, 404, 422},
    ("get", "/events"): {200, 401, 422},
    ("post", "/plan"): {200, 401, 413, 422},
}
# Every route: an unknown query parameter (422) and a Host that does not name the daemon
# (421); every POST: a foreign Origin (403) and a Content-Type that is not JSON (415).
for (_method, _path), _codes in EXPECTED.items():
    _codes |= {421, 422} | ({403, 415} if _method == "post" else set())


def documented(doc: dict[str, Any]) -> dict[tuple[str, str], set[int]]:
    return {
        (method, path): {int(code) for code in op["responses"]}
        for path, item in doc["paths"].items()
        for method, op in item.items()
    }


def valid_openapi(doc: dict[str, Any]) -> None:
    """A valid OpenAPI 3.1 document, as client generators need. The validator is a test
    extra (``pip install -e '.[test]'``): without it this check fails — it never passes
    without having looked."""
    try:
        from openapi_spec_validator import validate
    except ImportError as exc:
        raise AssertionError(
            f"openapi-spec-validator is not installed ({exc}), so the OpenAPI document "
            "cannot be checked; install the test extra: pip install -e '.[test]'"
        ) from exc
    validate(doc)


def test_openapi_lists_every_code_each_route_answers(tmp_path: Path) -> None:
    run(lambda: _every_code(tmp_path), timeout=60)


async def held_start(rig: Rig) -> None:
    """The next launch is not ready until ``release_start`` (a slow model load)."""
    rig.procs.plan(Behaviour(hold_ready=True))


async def release_start(rig: Rig) -> None:
    """Let the held launch become ready (once it has been spawned)."""
    await until(lambda: any(h.held for h in rig.procs.handles), 10, "the held launch")
    for handle in rig.procs.handles:
        handle.held = False


async def state_is(rig: Rig, state: str) -> None:
    await until(
        lambda: rig.sup.state == ServerState(state) and rig.sup.operation is None, 10, state
    )


async def _every_code(tmp_path: Path) -> None:
    # Held starts end when the test lets them go, not at the fakes' 0.5 s ready timeout.
    async with api_client(tmp_path, token=TOKEN, max_body_bytes=4096, ready_timeout_s=60.0) as (
        client,
        rig,
        app,
    ):
        await _check(client, rig, app)


async def _check(client: httpx.AsyncClient, rig: Rig, app: Any) -> None:
    doc = (await client.get("/openapi.json")).json()
    valid_openapi(doc)
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
    bare = {"Authorization": ""}
    seen: dict[tuple[str, str], set[int]] = {k: set() for k in EXPECTED}

    async def call(
        method: str, route: str, url: str, headers: dict[str, str] | None = None, **kw: Any
    ) -> httpx.Response:
        r = await client.request(method.upper(), url, headers=headers, **kw)
        assert r.status_code in EXPECTED[(method, route)], (method, url, r.status_code, r.text)
        seen[(method, route)].add(r.status_code)
        if r.status_code >= 400 and route != "/readyz":
            Problem.model_validate(r.json())  # the one error shape
        return r

    # 401 on every route that needs the token; the public ones answer without it.
    for method, route in EXPECTED:
        url = route.replace("{op_id}", "x")
        body = {"json": {}} if method == "post" else {}
        r = await call(method, route, url, headers=bare, **body)
        if route in ("/healthz", "/readyz"):
            assert r.status_code == 200
        else:
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    for route in ("/healthz", "/status", "/levers", "/levers/schema", "/metrics", "/operations"):
        await call("get", route, route)
    assert (await client.get("/healthz")).json()["version"] == version()
    assert (await client.get("/status")).json()["version"] == version()
    assert (await client.get("/metrics")).headers["content-type"] == CONTENT_TYPE_LATEST
    await call("get", "/readyz", "/readyz")
    await call("get", "/operations", "/operations", params={"limit": 0})  # 422
    await call("get", "/operations/{op_id}", "/operations/nope")  # 404
    await call("get", "/logs", "/logs", params={"tail": 5})
    await call("get", "/logs", "/logs", params={"launch": 999})  # 404
    await call("get", "/logs", "/logs", params={"tail": -1})  # 422
    await call("post", "/levers", "/levers", json={"levers": {"no_such_flag": 1}})  # 422
    await call("post", "/levers", "/levers", json={"levers": {}, "bogus": 1})  # 422
    await call(
        "post",
        "/levers",
        "/levers",
        content=b"{" + b" " * 5000 + b"}",
        headers={"content-type": "application/json"},
    )  # 413
    await call(
        "post",
        "/plan",
        "/plan",
        content=b"{" + b" " * 5000 + b"}",
        headers={"content-type": "application/json"},
    )  # 413
    await call("post", "/plan", "/plan", json={"gpus": "many"})  # 422
    await call(
        "post", "/levers", "/levers", json={"levers": {"mem_fraction_static": 0.8}, "dry_run": True}
    )  # 200
    for route in ("/stop", "/start", "/restart"):
        await call("post", route, route, params={"wait": "maybe"})  # 422
    await call("get", "/events", "/events", params={"replay": "nope"})  # 422
    # In-process the stream is read to its end: end it first (as the daemon's stop does).
    close_streams(app)
    r = await call("get", "/events", "/events")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")

    # A slow apply: 202, then 409 (with Retry-After) on every operation route, /readyz 503.
    await held_start(rig)
    accepted = await call(
        "post", "/levers", "/levers", json={"levers": {"mem_fraction_static": 0.86}}
    )
    assert accepted.status_code == 202
    op_id = accepted.json()["operation"]["id"]
    for route in ("/levers", "/stop", "/start", "/restart", "/reconcile"):
        r = await call(
            "post",
            route,
            route,
            json={"levers": {"mem_fraction_static": 0.8}} if route == "/levers" else None,
        )
        assert r.status_code == 409 and r.headers["retry-after"].isdigit(), r
        assert r.json()["detail"]["operation"] == op_id
    await until(lambda: rig.sup.state == ServerState.STARTING, 10, "the slow start")
    r503 = (await call("get", "/readyz", "/readyz", headers=bare)).json()
    assert r503["ready"] is False and r503["state"] != "ready"
    await release_start(rig)
    await state_is(rig, "ready")
    # GET /operations/{id} answers in the POST's envelope.
    got = (await call("get", "/operations/{op_id}", f"/operations/{op_id}")).json()
    assert set(got) == {"operation"} and got["operation"]["id"] == op_id
    assert got["operation"]["state"] == "succeeded"
    listed = (await call("get", "/operations", "/operations", params={"limit": 2})).json()[
        "operations"
    ]
    assert listed[0]["id"] == op_id and len(listed) == 2  # newest first

    # Cancel: unknown 404, ended 409, a running one 202 (200 with ?wait=true), bad wait 422.
    cancel = "/operations/{op_id}/cancel"
    await call("post", cancel, "/operations/nope/cancel")
    ended = await call("post", cancel, f"/operations/{op_id}/cancel")
    assert ended.status_code == 409 and ended.json()["detail"]["operation"]["id"] == op_id
    await call("post", cancel, f"/operations/{op_id}/cancel", params={"wait": "maybe"})
    for wait in ("false", "true"):
        await held_start(rig)
        r = await client.post("/levers", json={"levers": {"mem_fraction_static": 0.87}})
        slow = r.json()["operation"]
        await until(lambda: rig.sup.state == ServerState.STARTING, 10, "the slow start")
        r = await call("post", cancel, f"/operations/{slow['id']}/cancel", params={"wait": wait})
        assert r.status_code == (200 if wait == "true" else 202), r.text
        await state_is(rig, "ready")

    # 200 with ?wait=true, 202 without, for stop/start/restart.
    assert (await call("post", "/restart", "/restart", params={"wait": "true"})).status_code == 200
    assert (await call("post", "/stop", "/stop")).status_code == 202
    await state_is(rig, "stopped")
    assert (await call("post", "/start", "/start", params={"wait": "true"})).status_code == 200
    assert (await call("post", "/stop", "/stop", params={"wait": "true"})).status_code == 200
    assert (await call("post", "/start", "/start")).status_code == 202
    await state_is(rig, "ready")
    assert (await call("post", "/restart", "/restart")).status_code == 202
    await state_is(rig, "ready")
    # Reconcile: the config's levers (the rig's initial ones) differ, 202; then none, 200.
    assert (await call("post", "/reconcile", "/reconcile")).status_code == 202
    await state_is(rig, "ready")
    r = await call("post", "/reconcile", "/reconcile", params={"wait": "true"}, json={})
    assert r.status_code == 200 and r.json()["operation"]["state"] == "succeeded", r.text
    await call("post", "/reconcile", "/reconcile", json={"dry_run": "yes"})  # 422
    await call(
        "post",
        "/reconcile",
        "/reconcile",
        content=b"{" + b" " * 5000 + b"}",
        headers={"content-type": "application/json"},
    )  # 413
    # The fake server's model is nowhere on disk: the plan gets the model's config inline.
    await call("post", "/plan", "/plan", json={"config_json": LLAMA_CONFIG})
    history = (await call("get", "/history", "/history")).json()
    assert history["max_samples"] == 1800 and len(history["t"]) <= 1800
    await call("get", "/history", "/history", params={"since": "yesterday"})  # 422

    # What sglang_supervisor_api.request_guard refuses before any route runs, on every route.
    for method, route in EXPECTED:
        url = route.replace("{op_id}", "x")
        await call(method, route, url, params={"no_such_parameter": 1})  # 422
        await call(method, route, f"http://evil.example:1{url}")  # 421
        if method == "post":
            await call(method, route, url, headers={"Origin": "http://evil.example"})  # 403
            await call(method, route, url, headers={"Content-Type": "text/plain"})  # 415

    never = {k: sorted(EXPECTED[k] - v) for k, v in seen.items() if EXPECTED[k] - v}
    assert not never, f"documented but never answered: {never}"


def test_docs_page_needs_no_cdn_and_no_token(tmp_path: Path) -> None:
    async def check() -> None:
        async with api_client(tmp_path, token=TOKEN, ready=False) as (client, _, _):
            client.headers.pop("Authorization")
            for path in ("/docs", "/", "/ui"):
                r = await client.get(path)
                assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
                assert "connect-src 'self'" in r.headers["content-security-policy"]
                # Nothing loaded from elsewhere: no external src/href at all.
                assert not re.findall(r"(?:src|href)=[\"']?(?:https?:)?//", r.text), path
            assert (await client.get("/openapi.json")).status_code == 200

    run(check)


def test_a_body_that_is_not_json_says_where_and_what_to_send(tmp_path: Path) -> None:
    """It said ``{"lever": "0", "message": "JSON decode error"}``: no field named 0, and
    nothing said what to send."""

    async def check() -> None:
        async with api_client(tmp_path, token=TOKEN) as (client, _, _):
            for path in ("/levers", "/reconcile", "/plan"):
                r = await client.post(path, content=b"{not json")
                assert r.status_code == 422, (path, r.text)
                (problem,) = r.json()["detail"]["problems"]
                assert problem["lever"] == "body", (path, problem)
                assert "not valid JSON" in problem["message"], (path, problem)
                assert "at character 1" in problem["message"], (path, problem)

    run(check)
