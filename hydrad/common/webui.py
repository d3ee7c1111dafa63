"""The web chat page both daemons serve at ``GET /`` (llama-server serves its web UI there): one
static HTML file with its script inline (``static/index.html``), no request to any other address.

The page lists the models of ``/v1/models`` and streams a chat over ``/v1/chat/completions`` (SSE),
showing tokens as they arrive. It is served from the door it talks to, so its requests are
same-origin and pass the browser-origin defence (:mod:`hydrad.common.browser`) as they are; a page
of another site still cannot drive the door through its visitor's browser. With an API key the
page sends ``Authorization: Bearer <key>`` from a field kept in the browser's ``localStorage``: the
page itself holds no secret, so it is served without the key, as ``/health`` is.

``http.webui: false`` (llama-server's ``--no-webui``) turns it off: ``/`` is then a 404 like any
unknown path.
"""

from __future__ import annotations

from importlib import resources

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

PATHS = ("/", "/index.html")
_HEADERS = {
    # the page loads nothing from elsewhere and talks only to the door that served it
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                               "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class WebUiSetting(BaseModel):
    """The ``http`` setting both daemons share for the page."""

    webui: bool = Field(True, description="Serve the web chat page at GET / (llama-server's web UI; --no-webui "
                        "turns it off): it lists the models and streams a chat, from the same origin, with the "
                        "API key a user types into it kept in the browser.")


def page() -> bytes:
    """The page's bytes, read from the package once."""
    global _page
    if _page is None:
        _page = resources.files("hydrad.common").joinpath("static/index.html").read_bytes()
    return _page


_page: bytes | None = None


async def _serve(_: Request) -> Response:
    return Response(page(), media_type="text/html; charset=utf-8", headers=_HEADERS)


def routes(enabled: bool) -> list[Route]:
    """``GET /`` and ``/index.html`` when the page is on; none when it is off."""
    return [Route(path, _serve, methods=["GET", "HEAD"]) for path in PATHS] if enabled else []
