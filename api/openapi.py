"""The OpenAPI document: FastAPI's, plus what the middleware does that routes cannot say.

Added: the bearer scheme (``components.securitySchemes.bearer``) on every operation that
needs the token, its 401 answer, 413 on operations with a body, 422 everywhere (an unknown
query parameter), 421 everywhere (Host) and 403/415 on every POST (Origin, Content-Type).
All errors have one shape (:class:`sglang_supervisor_api.responses.Problem`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from sglang_supervisor_api.auth import PUBLIC_PATHS, read_only_allows

API_DESCRIPTION = """\
Owns one SGLang server and changes its launch flags ("levers") atomically: validate,
preflight, stop, verify the GPUs released, start, probation, commit, or roll back to the
last-good levers.

Every call but `/healthz`, `/readyz`, the status page (`/`), `/docs` and this document
needs `Authorization: Bearer <token>` when the daemon has a token (and `/metrics` unless
`[api] metrics_public`); the read-only token (`[api] read_token_file`) opens every GET and
`POST /plan`, and gets 403 on every other call. Errors are
`{"detail": {"message": ..., "problems": [...], "operation": ...}}`. A 409 carries
`Retry-After`. Operations answer in one envelope, `{"operation": {...}}`: 202 while
running, 200 once ended (`?wait=true`, dry runs).

Every POST needs `Content-Type: application/json` (also without a body): 415 otherwise.
A `Host` that does not name the daemon is refused with 421, a POST from a web page of
another origin with 403, a query parameter the route does not take with 422.
"""

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}


def _problem(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": PROBLEM_REF}}}


def _free_string(schema: dict[str, Any]) -> bool:
    options = schema.get("anyOf", [schema])
    return all(
        o.get("type") in ("string", "null") and not set(o) - {"type", "title", "description"}
        for o in options
    )


def _can_refuse(op: dict[str, Any]) -> bool:
    """Whether a request to ``op`` can be refused with 422: a body, or a typed parameter."""
    if "requestBody" in op:
        return True
    return any(not _free_string(p.get("schema", {})) for p in op.get("parameters", []))


def build_openapi(app: FastAPI, version: str) -> dict[str, Any]:
    """The document ``/openapi.json`` serves (built once, then cached on the app)."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(
        title=app.title,
        version=version,
        summary=app.summary,
        description=API_DESCRIPTION,
        routes=app.routes,
    )
    components = doc.setdefault("components", {})
    components.setdefault("securitySchemes", {})["bearer"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "The daemon's token: $SGLANG_SUPERVISOR_TOKEN or [api] token_file; "
        "or the read-only one ($SGLANG_SUPERVISOR_READ_TOKEN or [api] read_token_file) for "
        "every GET and POST /plan (403 on every other call)",
    }
    schemas = components.setdefault("schemas", {})
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            responses = op.setdefault("responses", {})
            # Every route refuses an unknown query parameter
            # (sglang_supervisor_api.request_guard.known_query); FastAPI's own 422 shape is
            # replaced by ours (sglang_supervisor_api.app's handler).
            described = responses.get("422", {}).get("description")
            if not _can_refuse(op):
                described = "an unknown query parameter"
            responses["422"] = _problem(described or "the request was refused")
            # What sglang_supervisor_api.request_guard refuses before any route runs.
            responses.setdefault("421", _problem("the Host header does not name this daemon"))
            if method == "post":
                refused = "a web page of another origin"
                if not read_only_allows("POST", path):
                    refused += ", or the read-only token (it can only read)"
                responses.setdefault("403", _problem(refused))
                responses.setdefault("415", _problem("Content-Type is not application/json"))
            # Errors are JSON whatever the route's own media type (text for /logs...).
            for code, answer in responses.items():
                if int(code) >= 400 and "Problem" not in str(answer.get("content", {})):
                    if not (path == "/readyz" and code == "503"):
                        responses[code] = _problem(answer.get("description") or "refused")
                elif int(code) >= 400:
                    answer["content"] = {"application/json": {"schema": PROBLEM_REF}}
            if path in PUBLIC_PATHS:
                op["security"] = []
            else:
                op["security"] = [{"bearer": []}]
                responses.setdefault("401", _problem("a bearer token is required"))
            if "requestBody" in op:
                responses.setdefault("413", _problem("the body is over [api] max_request_bytes"))
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    app.openapi_schema = doc
    return doc
