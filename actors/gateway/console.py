"""The web console: one page served by the gateway at ``/``, its script and style at
``/console/{file}``.

The page is a client of the REST API like any other: it calls the routes of
``ROUTES`` with the token its user types in, so it can see and change no more than
that token may, and what it shows is what the API answers. That is why these
routes are not in ``ROUTES``: they serve files, not the API, need no token (the
files hold no data), and are not in ``/openapi.json``. Every file ships in the
package (``actors/gateway/static``): a cluster may have no internet, so no CDN. The
content security policy allows only this origin's script and style.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

CONSOLE_DIR = Path(__file__).resolve().parent / "static"
ASSETS = {
    "console.js": "text/javascript",
    "console.css": "text/css",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def add_console(app: web.Application) -> None:
    app.router.add_get("/", _index)
    app.router.add_get("/console/{name}", _asset)


async def _index(_request: web.Request) -> web.Response:
    return _file("index.html", "text/html")


async def _asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in ASSETS:  # only the files listed: no path ever reaches the disk
        raise web.HTTPNotFound(text=f"no console file {name!r}")
    return _file(name, ASSETS[name])


def _file(name: str, content_type: str) -> web.Response:
    body = (CONSOLE_DIR / name).read_bytes()
    return web.Response(
        body=body, content_type=content_type, charset="utf-8", headers=SECURITY_HEADERS
    )
