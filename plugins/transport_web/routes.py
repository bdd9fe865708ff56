"""Serve the page: ``<path>`` is ``index.html`` and ``<path>assets/<name>`` its other files.

These routes are public (the page must load before it can ask for the API key); they hold only
the page's own code, never data: every request for data goes to ``/agentik`` with the key. Every
answer carries a Content-Security-Policy that allows only this origin, so even a renderer bug
could not run a script a model wrote or send anything to another host.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

from aiohttp import web

from agentik.core.security import public

#: only this origin; images also from data: and blob: (the user's own attachments, inline)
CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "connect-src 'self'",
        "font-src 'self'",
        "manifest-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
}
TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def load_assets() -> dict[str, Asset]:
    """Every file of ``static/``, read once (the page is small: a test keeps it under 150 KB)."""
    assets = {}
    for entry in resources.files(__package__).joinpath("static").iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in TYPES:
            body = entry.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
            assets[entry.name] = Asset(body, TYPES[suffix], etag)
    return assets


def answer(request: web.Request, asset: Asset) -> web.Response:
    # no-cache: revalidated each load (a 304), so an upgraded server never runs a stale page
    headers = {**SECURITY_HEADERS, "ETag": asset.etag, "Cache-Control": "no-cache"}
    if request.headers.get("If-None-Match") == asset.etag:
        return web.Response(status=304, headers=headers)
    charset = "utf-8" if not asset.content_type.startswith("image/") else None
    return web.Response(
        body=asset.body, content_type=asset.content_type, charset=charset, headers=headers
    )


def add_routes(app: web.Application, path: str) -> None:
    assets = load_assets()

    @public
    async def index(request: web.Request) -> web.Response:
        return answer(request, assets["index.html"])

    @public
    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        found = assets.get(name)
        if found is None or name == "index.html":
            raise web.HTTPNotFound(text=f"no file {name!r} in the web page")
        return answer(request, found)

    @public
    async def to_slash(request: web.Request) -> web.Response:
        raise web.HTTPPermanentRedirect(path)

    app.router.add_get(path, index)
    app.router.add_get(path + "assets/{name}", asset)
    if path != "/":
        app.router.add_get(path.rstrip("/"), to_slash)
