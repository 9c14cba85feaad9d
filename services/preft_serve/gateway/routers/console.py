"""The web console at ``/console/``: the packaged static files under a strict
Content-Security-Policy.

Only files shipped in the package are served (a fixed table read at start, so no path
from the URL ever reaches the filesystem). The console holds the API key in memory and
sends it as a bearer token, never as a cookie, so there is no ambient credential a
cross-site request could use.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from preft_serve.common.errors import NotFound
from preft_serve.gateway.console import STATIC

router = APIRouter(prefix="/console", include_in_schema=False)

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; "
    "object-src 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # Assets change with the installed version; revalidate rather than serve a stale app.
    "Cache-Control": "no-cache",
}
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def _assets(root: Path) -> dict[str, tuple[bytes, str]]:
    """Every shippable file under ``root`` by its URL path, with its content type."""
    return {
        path.relative_to(root).as_posix(): (path.read_bytes(), TYPES[path.suffix])
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.suffix in TYPES
    }


ASSETS = _assets(STATIC)


def _serve(name: str) -> Response:
    asset = ASSETS.get(name)
    if asset is None:
        raise NotFound(f"the console has no file {name[:200]!r}", code="unknown_url")
    body, media_type = asset
    return Response(body, media_type=media_type, headers=HEADERS)


@router.get("")
async def console_root() -> RedirectResponse:
    return RedirectResponse("/console/", headers=HEADERS)


@router.get("/")
async def console_index() -> Response:
    return _serve("index.html")


@router.get("/{name:path}")
async def console_asset(name: str) -> Response:
    return _serve(name)
