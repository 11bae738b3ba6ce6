"""The OpenAPI document: FastAPI's, plus what the middleware does that routes cannot say.

Added: the bearer scheme (``components.securitySchemes.bearer``) on every operation that
needs the token, its 401 answer, 413 on operations with a body, and 422 only where a
parameter or body can be refused. All errors have one shape (:class:`api.responses.Problem`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.auth import PUBLIC_PATHS

API_DESCRIPTION = """\
Owns one SGLang server and changes its launch flags ("levers") atomically: validate,
preflight, stop, verify the GPUs released, start, probation, commit, or roll back to the
last-good levers.

Every call but `/healthz`, `/readyz`, the status page (`/`), `/docs` and this document
needs `Authorization: Bearer <token>` when the daemon has a token (and `/metrics` unless
`[api] metrics_public`). Errors are `{"detail": {"message": ..., "problems": [...],
"operation": ...}}`. A 409 carries `Retry-After`. Operations answer in one envelope,
`{"operation": {...}}`: 202 while running, 200 once ended (`?wait=true`, dry runs).
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
        "description": "The daemon's token: $SGLANG_SUPERVISOR_TOKEN or [api] token_file",
    }
    schemas = components.setdefault("schemas", {})
    for path, item in doc.get("paths", {}).items():
        for op in item.values():
            responses = op.setdefault("responses", {})
            if "422" in responses and not _can_refuse(op):
                del responses["422"]  # FastAPI lists it for any parameter, even a free string
            # FastAPI's own 422 shape is replaced by ours (api.app's handler).
            if "422" in responses:
                responses["422"] = _problem(
                    responses["422"].get("description") or "the request was refused"
                )
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
