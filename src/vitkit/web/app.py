"""The explorer's HTTP side: a FastAPI app over an :class:`~vitkit.web.session.Explorer`.

This module wires it: the bundled files, the API routes (:mod:`vitkit.web.routes`, written over
:mod:`vitkit.web.query`), the answers to errors (a user's mistake is 400 with its message, an
unknown image 404, a body too large 413) and the :class:`Guard` around all of it.

Safe by default (see :class:`Guard`): every API route and the page need the session token; the
Host header must name the bound address (DNS rebinding); a request that changes state from
another Origin is refused; bodies are capped before parsing; no CORS headers; every response
carries ``Content-Security-Policy: default-src 'self'`` and ``nosniff``. The files served are
the bundled assets, from a fixed table.
"""

from __future__ import annotations

import hmac
import json
from importlib import resources
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from vitkit.errors import VitkitError
from vitkit.web.query import BadQuery
from vitkit.web.routes import add_routes, encode
from vitkit.web.samples import Sample
from vitkit.web.session import Explorer, NotFound

__all__ = ["ASSETS", "BodyTooLarge", "Guard", "allowed_hosts", "create_app", "encode"]

ASSETS = {  # URL -> (bundled file, media type): the only files this server sends
    "/": ("index.html", "text/html; charset=utf-8"),
    "/explorer.js": ("explorer.js", "text/javascript; charset=utf-8"),
    "/explorer.css": ("explorer.css", "text/css; charset=utf-8"),
    "/favicon.svg": ("favicon.svg", "image/svg+xml"),
}
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),  # the token is in the page's URL
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]
LOOPBACK = ("127.0.0.1", "localhost", "::1")
WILDCARD = ("0.0.0.0", "::", "")


def allowed_hosts(host: str, port: int) -> set[str] | None:
    """Host header values accepted; None (any) when bound to every interface, where only the
    token protects (the user chose to serve other machines)."""
    if host in WILDCARD:
        return None
    names = {host} | (set(LOOPBACK) if host in LOOPBACK else set())
    out = set()
    for name in names:
        shown = f"[{name}]" if ":" in name else name
        out |= {f"{shown}:{port}", shown} if port == 80 else {f"{shown}:{port}"}
    return out


class BodyTooLarge(VitkitError):
    """A request body past the app's cap (answered 413)."""


def too_large(max_body: int, length: str | None = None) -> str:
    """The refusal of a body past ``max_body`` bytes (of ``length`` bytes when declared)."""
    size = f"is {length} bytes, more than" if length is not None else "is more than"
    return f"the request body {size} the {max_body / 2**20:g} MB allowed; send a smaller image"


class CappedReceive:
    """An ASGI ``receive`` that counts the request body's bytes as the app reads them and
    raises :class:`BodyTooLarge` past ``limit``: the cap holds without a Content-Length too."""

    def __init__(self, receive, limit: int) -> None:
        self.receive, self.limit, self.seen = receive, limit, 0

    async def __call__(self) -> dict:
        message = await self.receive()
        if message["type"] == "http.request":
            self.seen += len(message.get("body", b""))
            if self.seen > self.limit:
                raise BodyTooLarge(too_large(self.limit))
        return message


class Guard:
    """ASGI middleware: token, Host, Origin and body-size checks, and the security headers.

    A request refused is answered here (JSON ``{"error": ...}``); one let through reaches the
    app with its body capped (:class:`CappedReceive`) and its answer given the headers."""

    def __init__(self, app, *, token: str, hosts: set[str] | None, max_body: int) -> None:
        self.app, self.token, self.hosts, self.max_body = app, token, hosts, max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope["headers"]}
        refusal = self.refusal(scope, headers)
        if refusal is not None:
            status, message = refusal
            await _send_json(send, status, {"error": message})
            return
        await self.app(scope, CappedReceive(receive, self.max_body), _with_headers(send))

    def refusal(self, scope, headers: dict[str, str]) -> tuple[int, str] | None:
        """(status, message) when the request must be refused, else None."""
        host = headers.get("host", "")
        if self.hosts is not None and host not in self.hosts:
            return 400, (f"Host {host!r} is not this server's address ({sorted(self.hosts)[0]}); "
                         "open the address `vitkit explore` printed")
        origin = headers.get("origin")
        if scope["method"] not in ("GET", "HEAD") and origin is not None:
            scheme = scope.get("scheme", "http")  # the page's own origin: same scheme and host
            if origin != f"{scheme}://{host}":
                return 403, (f"requests from another origin ({origin}) are refused; this "
                             f"server's origin is {scheme}://{host}")
        length = headers.get("content-length")
        if length is not None and not (length.isascii() and length.isdigit()):
            return 400, f"Content-Length {length!r} is not a number of bytes"
        if length is not None and int(length) > self.max_body:
            return 413, too_large(self.max_body, length)
        path = scope["path"]
        if path in ASSETS and path != "/":
            return None  # the bundled script and style sheet are not secret
        given = headers.get("x-vitkit-token") or \
            (parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token") or [""])[0]
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            what = "a wrong token" if given else "no token"
            return 403, (f"{what}: open the address `vitkit explore` printed (it ends with "
                         "?token=...), or send the token in the X-Vitkit-Token header")
        return None


def _with_headers(send):
    """``send`` adding :data:`SECURITY_HEADERS` to the response's start."""
    async def send_with_headers(message):
        if message["type"] == "http.response.start":
            message["headers"] = list(message.get("headers", [])) + SECURITY_HEADERS
        await send(message)
    return send_with_headers


async def _send_json(send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()), *SECURITY_HEADERS]})
    await send({"type": "http.response.body", "body": data})


ERROR_STATUS = ((NotFound, 404), (BodyTooLarge, 413), (BadQuery, 400))


async def _library_error(request: Request, err: VitkitError) -> JSONResponse:
    status = next((code for kind, code in ERROR_STATUS if isinstance(err, kind)), 400)
    return JSONResponse({"error": str(err)}, status_code=status)


async def _value_error(request: Request, err: ValueError) -> JSONResponse:
    return JSONResponse({"error": str(err)}, status_code=400)


async def _http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
    """Starlette's own answers (an unknown URL, a wrong HTTP method) as ``{"error": ...}``."""
    what = {404: f"{request.url.path} is not a page or API route of the explorer",
            405: f"{request.method} is not how {request.url.path} is asked (see docs/explore.md)"}
    return JSONResponse({"error": what.get(err.status_code, str(err.detail))},
                        status_code=err.status_code)


async def _bad_request(request: Request, err: RequestValidationError) -> JSONResponse:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "request"
    return JSONResponse({"error": f"{where}: {first.get('msg')}"}, status_code=400)


def add_assets(app: FastAPI) -> None:
    """Serve the bundled files of :data:`ASSETS`, read once."""
    for url, (name, media) in ASSETS.items():
        data = resources.files("vitkit.web").joinpath("static", name).read_bytes()

        def asset(data=data, media=media) -> Response:
            return Response(data, media_type=media)
        app.add_api_route(url, asset, methods=["GET"], include_in_schema=False)


def create_app(explorer: Explorer, *, token: str, host: str = "127.0.0.1", port: int = 8765,
               samples: list[Sample] | None = None, max_body: int = 20 * 2**20,
               compare: Explorer | None = None) -> Guard:
    """The explorer app (an ASGI app) for ``explorer``, guarded by ``token`` and bound to
    ``host:port``; ``max_body`` caps request bodies in bytes; ``compare``: a second checkpoint
    of the same architecture, asked with ``model=b``."""
    app = FastAPI(title="vitkit explore", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(VitkitError, _library_error)
    app.add_exception_handler(ValueError, _value_error)
    app.add_exception_handler(RequestValidationError, _bad_request)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    add_assets(app)
    add_routes(app, explorer, samples or [], compare)
    return Guard(app, token=token, hosts=allowed_hosts(host, port), max_body=max_body)
