"""The status page (``GET /``, ``/ui``) and the API docs (``GET /docs``): one
self-contained HTML file each under ``api/static/``, no build step, nothing from a CDN.
Both are served without the token; they ask for it and send it on every call they make."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

STATIC = Path(__file__).resolve().parent / "static"
#: Inline script and style only, calls to this daemon only: nothing else is loaded.
CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
}

router = APIRouter(include_in_schema=False)


def _page(name: str) -> FileResponse:
    return FileResponse(STATIC / name, media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/")
async def status_page() -> FileResponse:
    return _page("status.html")


@router.get("/ui")
async def status_page_alias() -> FileResponse:
    return _page("status.html")


@router.get("/docs")
async def api_docs() -> FileResponse:
    return _page("docs.html")
