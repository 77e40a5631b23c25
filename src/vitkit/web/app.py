"""The explorer's HTTP side: a FastAPI app over an :class:`~vitkit.web.session.Explorer`.

Routes are thin: parse, call the explorer (which calls :mod:`vitkit.explain`), encode. Arrays
travel as ``{"shape": [...], "b64": float32 little-endian bytes}``; the page decodes them into
typed arrays.

Safe by default (see :class:`Guard`): every API route and the page need the session token; the
Host header must name the bound address (DNS rebinding); a request that changes state from
another Origin is refused; bodies are capped before parsing; no CORS headers; every response
carries ``Content-Security-Policy: default-src 'self'`` and ``nosniff``. The files served are
the bundled assets, from a fixed table.
"""

from __future__ import annotations

import base64
import hmac
import io
import json
from importlib import resources
from urllib.parse import parse_qs

import numpy as np
import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from vitkit.errors import VitkitError
from vitkit.web.samples import Sample
from vitkit.web.session import Explorer, NotFound, View

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


class Guard:
    """ASGI middleware: token, Host, Origin and body-size checks, and the security headers."""

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

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + SECURITY_HEADERS
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def refusal(self, scope, headers: dict[str, str]) -> tuple[int, str] | None:
        host = headers.get("host", "")
        if self.hosts is not None and host not in self.hosts:
            return 400, (f"Host {host!r} is not this server's address ({sorted(self.hosts)[0]}); "
                         "open the address `vitkit explore` printed")
        origin = headers.get("origin")
        if scope["method"] not in ("GET", "HEAD") and origin is not None:
            if origin == "null" or origin.split("://", 1)[-1] != host:
                return 403, f"requests from another origin ({origin}) are refused"
        length = headers.get("content-length")
        if length is not None and not (length.isascii() and length.isdigit()):
            return 400, f"Content-Length {length!r} is not a number of bytes"
        if length is not None and int(length) > self.max_body:
            return 413, (f"the request body is {length} bytes, more than the "
                         f"{self.max_body / 2**20:g} MB allowed; send a smaller image")
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


async def _send_json(send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()), *SECURITY_HEADERS]})
    await send({"type": "http.response.body", "body": data})


def encode(t: torch.Tensor | np.ndarray) -> dict:
    """An array -> {"shape", "b64"} of float32 little-endian values."""
    a = t.detach().cpu().float().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    a = np.ascontiguousarray(a, dtype="<f4")
    return {"shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode()}


def _first_view(explorer: Explorer, view: View, label: str) -> dict:
    pic = np.ascontiguousarray(view.picture, dtype=np.uint8)
    return dict(
        image=view.id, label=label, top=explorer.top(view),
        predicted=int(view.logits.argmax()), box=list(view.box) if view.box else None,
        picture={"shape": list(pic.shape), "b64": base64.b64encode(pic.tobytes()).decode()},
        heads=encode(explorer.model_view(view)),
    )


async def _read_body(request: Request, limit: int) -> bytes:
    """The whole body, refused past ``limit`` bytes even without a Content-Length."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the request body is more than the {limit / 2**20:g} MB "
                               "allowed; send a smaller image")
        chunks.append(chunk)
    return b"".join(chunks)


class BodyTooLarge(VitkitError):
    pass


def _float(value: str | None, name: str, default: float) -> float:
    if value is None or value == "":
        return default
    try:
        return float(value)
    except ValueError:
        raise VitkitError(f"{name} must be a number, got {value!r}") from None


def _int(value: str | None, name: str, default: int | None) -> int | None:
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise VitkitError(f"{name} must be a whole number, got {value!r}") from None


def create_app(explorer: Explorer, *, token: str, host: str = "127.0.0.1", port: int = 8765,
               samples: list[Sample] | None = None, max_body: int = 20 * 2**20) -> Guard:
    """The explorer app (an ASGI app) for ``explorer``, guarded by ``token`` and bound to
    ``host:port``; ``max_body`` caps request bodies in bytes."""
    samples = samples or []
    app = FastAPI(title="vitkit explore", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(VitkitError)
    async def _library_error(request, err: VitkitError):
        status = 404 if isinstance(err, NotFound) else 413 if isinstance(err, BodyTooLarge) \
            else 400
        return JSONResponse({"error": str(err)}, status_code=status)

    @app.exception_handler(ValueError)
    async def _value_error(request, err: ValueError):
        return JSONResponse({"error": str(err)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request, err: RequestValidationError):
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())[1:]) or "request"
        return JSONResponse({"error": f"{where}: {first.get('msg')}"}, status_code=400)

    for url, (name, media) in ASSETS.items():
        data = resources.files("vitkit.web").joinpath("static", name).read_bytes()

        def asset(data=data, media=media) -> Response:
            return Response(data, media_type=media)
        app.add_api_route(url, asset, methods=["GET"], include_in_schema=False)

    def view_of(q) -> View:
        image = q.get("image")
        if not image:
            raise VitkitError("image is missing: send an image first (POST /api/image)")
        return explorer.view(image)

    def options(q) -> dict:
        return dict(layer=_int(q.get("layer"), "layer", -1), head=q.get("head") or "mean",
                    residual=_float(q.get("residual"), "residual", 0.5),
                    fusion=q.get("fusion") or "mean",
                    discard_ratio=_float(q.get("discard"), "discard", 0.0))

    @app.get("/api/model")
    def model_info() -> dict:
        return {**explorer.info(),
                "samples": [dict(id=i, group=s.group, label=s.label)
                            for i, s in enumerate(samples)]}

    @app.post("/api/image")
    async def upload(request: Request) -> dict:
        body = await _read_body(request, max_body)
        name = "the uploaded file"
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            request._body = body  # Starlette's form parser re-reads the body from here
            form = await request.form()
            files = [v for v in form.values() if hasattr(v, "read")]
            if not files:
                raise VitkitError("the form holds no file: send the image as the field 'file'")
            body = await files[0].read()
        view = await _in_thread(explorer.add, body, name)
        return _first_view(explorer, view, "uploaded image")

    @app.post("/api/sample")
    async def sample(request: Request) -> dict:
        index = _int(request.query_params.get("id"), "sample id", None)
        if index is None or not 0 <= index < len(samples):
            raise VitkitError(f"sample {request.query_params.get('id')!r} does not exist: "
                              f"there are {len(samples)} samples (0..{len(samples) - 1})")
        s = samples[index]
        try:
            data, box = s.load()
        except OSError as err:
            raise VitkitError(f"cannot read sample {s.label}: {err}") from err
        if isinstance(data, bytes):
            view = await _in_thread(explorer.add, data, s.label, box)
        else:
            view = await _in_thread(explorer.add_image, data, box)
        return _first_view(explorer, view, s.label)

    @app.get("/api/view")
    def first_view(request: Request) -> dict:
        view = view_of(request.query_params)
        return _first_view(explorer, view, "")

    @app.get("/api/heads")
    def fused_heads(request: Request) -> dict:
        view = view_of(request.query_params)
        return dict(map=encode(explorer.fused_view(view, request.query_params.get("fusion"))))

    @app.get("/api/token")
    def token_row(request: Request) -> dict:
        q = request.query_params
        view, o = view_of(q), options(q)
        token = _int(q.get("query"), "query", None)
        if token is None:
            raise VitkitError("query is missing: which token's row (0 = the first prefix "
                              "token, then the patches row by row)")
        rows = explorer.token_row(view, token, o["layer"], o["head"], residual=o["residual"],
                                  fusion=o["fusion"], discard_ratio=o["discard_ratio"])
        return dict(token=token, row=encode(rows["row"]), rollout=encode(rows["rollout"]))

    @app.get("/api/method")
    def method_map(request: Request) -> dict:
        q = request.query_params
        view = view_of(q)
        shown = explorer.method_map(view, q.get("method") or "rollout",
                                    _int(q.get("target"), "target", None), **options(q))
        target = explorer.explained_class(shown)
        return dict(method=shown.method, target=target,
                    target_name=explorer.class_names()[target] if target is not None else None,
                    map=encode(shown.map[0]))

    @app.get("/api/faithfulness")
    def faithfulness(request: Request) -> dict:
        q = request.query_params
        view = view_of(q)
        steps = _int(q.get("steps"), "steps", 16)
        if not 2 <= steps <= 64:
            raise VitkitError(f"steps must be 2..64, got {steps}")
        r = explorer.faithfulness(view, q.get("method") or "rollout",
                                  _int(q.get("target"), "target", None), steps, **options(q))
        return dict(target=r["target"], fractions=r["fractions"].tolist(),
                    deletion=r["deletion"].tolist(), insertion=r["insertion"].tolist(),
                    deletion_auc=r["deletion_auc"].tolist(),
                    insertion_auc=r["insertion_auc"].tolist(), rows=["map", "random"])

    @app.get("/api/stats")
    def head_stats(request: Request) -> dict:
        view = view_of(request.query_params)
        s = explorer.head_stats(view)
        return dict(entropy=encode(s["entropy"]), distance=encode(s["distance"]),
                    uniform_distance=s["uniform_distance"], max_entropy=s["max_entropy"],
                    norms=encode(s["norms"]), outliers=s["outliers"])

    @app.get("/api/causal")
    def causal(request: Request) -> dict:
        q = request.query_params
        view = view_of(q)
        c = explorer.causal(view, _int(q.get("target"), "target", None),
                            q.get("measure") or "logit")
        return dict(target=c["target"], measure=c["measure"],
                    importance=encode(c["importance"]), lens_prob=c["lens_prob"].tolist(),
                    lens_top=c["lens_top"].tolist(), lens_top_names=c["lens_top_names"])

    @app.get("/api/export.npz")
    def export(request: Request) -> Response:
        q = request.query_params
        view, o = view_of(q), options(q)
        shown = explorer.method_map(view, q.get("method") or "rollout",
                                    _int(q.get("target"), "target", None), **o)
        arrays = dict(
            picture=view.picture, logits=view.logits[0].numpy(),
            heads=explorer.model_view(view).numpy(),
            attention=np.stack([m[0].numpy() for m in view.maps]),
            method_map=shown.map[0].numpy(), target=np.array(int(shown.target[0])),
            settings=np.array(json.dumps({k: v for k, v in q.items() if k != "token"})))
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        return Response(buf.getvalue(), media_type="application/octet-stream", headers={
            "content-disposition": f'attachment; filename="vitkit-{view.id[:8]}.npz"'})

    return Guard(app, token=token, hosts=allowed_hosts(host, port), max_body=max_body)


async def _in_thread(fn, *args):
    """Run blocking model work off the event loop."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, *args)
