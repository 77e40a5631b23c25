"""The explorer's API routes: each reads its query (:class:`~vitkit.web.query.Query`), calls the
:class:`~vitkit.web.session.Explorer` (which calls :mod:`vitkit.explain`) and encodes the answer.

Arrays travel as ``{"shape": [...], "b64": float32 little-endian bytes}`` (:func:`encode`); the
page decodes them into typed arrays. The picture travels the same way as uint8 values.
"""

from __future__ import annotations

import base64
import contextvars
import inspect
from collections.abc import Callable

import numpy as np
import torch
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from vitkit.errors import VitkitError
from vitkit.explain.attention import HEAD_FUSIONS
from vitkit.explain.causal import MEASURES
from vitkit.explain.lrp import BUDGET_LABELS
from vitkit.web.query import BadQuery, Query
from vitkit.web.samples import Sample
from vitkit.web.session import Explorer, View, constant_note, is_constant

SEND_AN_IMAGE = "send an image first (POST /api/image)"
JOB_KINDS = ("faithfulness", "importance", "methods", "causal")
WHICH_TOKEN = "which token's row (0 = the first prefix token, then the patches row by row)"


def encode(t: torch.Tensor | np.ndarray) -> dict:
    """An array of any shape -> {"shape": [...], "b64": its float32 little-endian bytes}."""
    a = t.detach().cpu().float().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    a = np.ascontiguousarray(a, dtype="<f4")
    return {"shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode()}


def encode_picture(picture: np.ndarray) -> dict:
    """An (H, W, 3) image -> {"shape": [H, W, 3], "b64": its uint8 bytes}."""
    pic = np.ascontiguousarray(picture, dtype=np.uint8)
    return {"shape": list(pic.shape), "b64": base64.b64encode(pic.tobytes()).decode()}


def view_answer(explorer: Explorer, view: View, label: str) -> dict:
    """What the page first shows of an image: its id, the top classes, the prediction, the
    object's box, the picture the model sees and every head's readout (layers, heads, gh, gw)."""
    return dict(
        image=view.id, label=label, top=explorer.top(view),
        predicted=int(view.logits.argmax()), box=list(view.box) if view.box else None,
        picture=encode_picture(view.picture), heads=encode(explorer.model_view(view)))


def method_answer(explorer: Explorer, view: View, method: str, target, options: dict) -> dict:
    """A method's map for the page: the map, the class it explains, its range, whether it
    is constant (with the note that says so), and for a relevance (LRP) method its budget:
    [[label, value, share of the logit]] for each part, pixels to the rules' remainder."""
    shown = explorer.method_map(view, method, target, **options)
    explained = explorer.explained_class(shown)
    name = explorer.class_names()[explained] if explained is not None else None
    m = shown.map[0]
    constant = is_constant(m)
    budget = None
    if shown.budget is not None:
        logit = float(sum(v[0] for v in shown.budget.values()))
        budget = [[BUDGET_LABELS[k], float(v[0]), float(v[0]) / logit if logit else 0.0]
                  for k, v in shown.budget.items()]
    return dict(method=shown.method, target=explained, target_name=name, map=encode(m),
                lo=float(m.min()), hi=float(m.max()), constant=constant,
                note=constant_note(shown.method, m) if constant else "", budget=budget)


def map_options(q: Query) -> dict:
    """The map settings a request may name (layer, head, rollout's residual, head fusion and
    discard ratio), as keyword arguments of :meth:`Explorer.method_map`."""
    return dict(layer=q.integer("layer", -1), head=q.text("head", "mean"),
                residual=q.number("residual", 0.5, lo=0, hi=1),
                fusion=q.choice("fusion", HEAD_FUSIONS, "mean"),
                discard_ratio=q.number("discard", 0.0, lo=0, hi=1, hi_open=True,
                                       what="a discard ratio"))


async def uploaded_bytes(request: Request) -> bytes:
    """The image a POST carries: the body itself, or the first file of a multipart form. The
    body is read through the app's guard, which refuses it past the size cap."""
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        return await request.body()
    async with request.form() as form:
        files = [v for v in form.values() if isinstance(v, UploadFile)]
        if not files:
            raise VitkitError("the form holds no file: send the image as the field 'file'")
        return await files[0].read()


def load_sample(sample: Sample):
    """``sample.load()``: (bytes or an RGB PIL image, its box or None); a read error is the
    user's (a file of --images gone or unreadable)."""
    try:
        return sample.load()
    except OSError as err:
        raise VitkitError(f"cannot read sample {sample.label}: {err}") from err


CURRENT: contextvars.ContextVar[Explorer] = contextvars.ContextVar("vitkit_explorer")


class Api:
    """The API routes of ``explorer`` and the sample table ``samples``, as bound methods; see
    :meth:`table` for their URLs. With ``compare`` (a second checkpoint of the same
    architecture), every route answers for it when the query says ``model=b``."""

    def __init__(self, explorer: Explorer, samples: list[Sample],
                 compare: Explorer | None = None) -> None:
        self.explorers = {"a": explorer, **({"b": compare} if compare is not None else {})}
        self.samples = samples

    @property
    def explorer(self) -> Explorer:
        """The explorer the current request asks (``model=a``, the default, or ``b``)."""
        return CURRENT.get()

    def _choose(self, request: Request) -> None:
        name = request.query_params.get("model", "a")
        if name not in self.explorers:
            raise BadQuery(f"model must be a (the checkpoint) or b (--compare-checkpoint), got "
                           f"{name!r}" + ("" if "b" in self.explorers else
                                          "; this server has no second checkpoint"))
        CURRENT.set(self.explorers[name])

    def _bind(self, handler: Callable) -> Callable:
        """``handler`` with the request's explorer chosen first (sync or async alike)."""
        args = (lambda request: (request,)) if inspect.signature(handler).parameters else (
            lambda request: ())
        if inspect.iscoroutinefunction(handler):
            async def bound(request: Request):
                self._choose(request)
                return await handler(*args(request))
        else:
            def bound(request: Request):
                self._choose(request)
                return handler(*args(request))
        bound.__name__ = handler.__name__
        return bound

    def table(self) -> list[tuple[str, str, Callable]]:
        """(HTTP method, URL, handler) of every route."""
        return [
            ("GET", "/api/model", self.model_info),
            ("POST", "/api/image", self.upload),
            ("POST", "/api/sample", self.sample),
            ("GET", "/api/view", self.first_view),
            ("GET", "/api/heads", self.fused_heads),
            ("GET", "/api/token", self.token_row),
            ("GET", "/api/method", self.method_map),
            ("GET", "/api/faithfulness", self.faithfulness),
            ("GET", "/api/stats", self.head_stats),
            ("GET", "/api/causal", self.causal),
            ("GET", "/api/features", self.features),
            ("GET", "/api/similar", self.similar),
            ("GET", "/api/export.npz", self.export),
            ("POST", "/api/job", self.start_job),
            ("GET", "/api/job", self.job),
            ("POST", "/api/job/cancel", self.cancel_job),
        ]

    def _view(self, q: Query) -> View:
        return self.explorer.view(q.text("image", missing=SEND_AN_IMAGE))

    # ------------------------------------------------------------------------ images in
    def model_info(self) -> dict:
        samples = [dict(id=i, group=s.group, label=s.label) for i, s in enumerate(self.samples)]
        compare = self.explorers.get("b")
        return {**self.explorer.info(), "samples": samples,
                "compare": compare.name if compare is not None else None}

    async def upload(self, request: Request) -> dict:
        data = await uploaded_bytes(request)
        view = await run_in_threadpool(self.explorer.add, data, "the uploaded file")
        return view_answer(self.explorer, view, "uploaded image")

    async def sample(self, request: Request) -> dict:
        q = Query(request.query_params)
        index, n = q.integer("id", label="sample id"), len(self.samples)
        if index is None or not 0 <= index < n:
            raise BadQuery(f"sample {q.params.get('id')!r} does not exist: there are {n} "
                           f"samples (0..{n - 1})")
        s = self.samples[index]
        data, box = load_sample(s)
        if isinstance(data, bytes):
            view = await run_in_threadpool(self.explorer.add, data, s.label, box)
        else:
            view = await run_in_threadpool(self.explorer.add_image, data, box)
        return view_answer(self.explorer, view, s.label)

    # ---------------------------------------------------------------------- what it shows
    def first_view(self, request: Request) -> dict:
        return view_answer(self.explorer, self._view(Query(request.query_params)), "")

    def fused_heads(self, request: Request) -> dict:
        q = Query(request.query_params)
        view = self._view(q)
        return dict(map=encode(self.explorer.fused_view(view, q.choice("fusion", HEAD_FUSIONS))))

    def token_row(self, request: Request) -> dict:
        q = Query(request.query_params)
        view, o = self._view(q), map_options(q)
        token = q.integer("query", missing=WHICH_TOKEN)
        rows = self.explorer.token_row(view, token, o["layer"], o["head"], residual=o["residual"],
                                       fusion=o["fusion"], discard_ratio=o["discard_ratio"])
        return dict(token=token, row=encode(rows["row"]), rollout=encode(rows["rollout"]))

    def method_map(self, request: Request) -> dict:
        q = Query(request.query_params)
        return method_answer(self.explorer, self._view(q), q.text("method", "rollout"),
                             q.integer("target"), map_options(q))

    def _methods(self, q: Query) -> Callable[..., dict]:
        """The maps of several methods (``methods=a,b,c``) as a job: each one in the partial
        answer as soon as it is computed."""
        view, target, options = self._view(q), q.integer("target"), map_options(q)
        names = [n for n in q.text("methods", missing="which methods (methods=chefer,gradcam)")
                 .split(",") if n]
        explorer = self.explorer

        def answer(progress=None) -> dict:
            done: dict = {}
            for k, name in enumerate(names):
                done[name] = method_answer(explorer, view, name, target, options)
                if progress is not None:
                    progress((k + 1) / len(names), dict(done))
            return done
        return answer

    def _faithfulness(self, q: Query, progress=None) -> Callable[[], dict]:
        """The faithfulness answer of query ``q``, as a function (run now or as a job)."""
        view = self._view(q)
        steps = q.integer("steps", 16, lo=2, hi=64)
        method, target, options = q.text("method", "rollout"), q.integer("target"), map_options(q)
        explorer = self.explorer  # a job runs on the worker thread: bind the request's now

        def answer(progress=None) -> dict:
            r = explorer.faithfulness(view, method, target, steps, progress=progress,
                                           **options)
            curves = ("fractions", "deletion", "insertion", "deletion_auc", "insertion_auc")
            verdicts = ("baseline", "percentile", "p_value", "random_maps", "randomisation",
                        "class_sensitivity", "verdict")
            return dict(target=r["target"], **{k: r[k].tolist() for k in curves},
                        **{k: r[k] for k in verdicts}, rows=["map", "random"])
        return answer

    def faithfulness(self, request: Request) -> dict:
        return self._faithfulness(Query(request.query_params))()

    def head_stats(self, request: Request) -> dict:
        s = self.explorer.head_stats(self._view(Query(request.query_params)))
        return dict(entropy=encode(s["entropy"]), distance=encode(s["distance"]),
                    uniform_distance=s["uniform_distance"], max_entropy=s["max_entropy"],
                    norms=encode(s["norms"]), outliers=s["outliers"])

    def features(self, request: Request) -> dict:
        """The PCA picture of the patch features (rgb (gh, gw, 3), foreground (gh, gw)), the
        explained variance and the high-norm artifact patches ([row, col])."""
        f = self.explorer.features_view(self._view(Query(request.query_params)))
        return dict(rgb=encode(f["rgb"]), foreground=encode(f["foreground"]),
                    explained=f["explained"], first_explained=f["first_explained"],
                    threshold=f["threshold"], artifacts=f["artifacts"])

    def similar(self, request: Request) -> dict:
        """The cosine similarity (gh, gw) of patch ``row``, ``col`` with every patch."""
        q = Query(request.query_params)
        view = self._view(q)
        row = q.integer("row", missing="which patch's row (0 = the top row)")
        col = q.integer("col", missing="which patch's column (0 = the left column)")
        m = self.explorer.similarity(view, row, col)
        return dict(row=row, col=col, map=encode(m), lo=float(m.min()), hi=float(m.max()))

    def causal(self, request: Request) -> dict:
        """The logit lens and the heads' importance estimated by attribution patching (at
        once); ``exact=1``: the ablation instead (one forward per layer; the page runs it as a
        job, POST /api/job?kind=importance)."""
        q = Query(request.query_params)
        view = self._view(q)
        target, measure = q.integer("target"), q.choice("measure", MEASURES, "logit")
        if q.choice("exact", ("0", "1"), "0") == "1":
            return self._importance(view, target, measure)()
        return self._causal(view, target, measure)()

    def _causal(self, view: View, target, measure) -> Callable[..., dict]:
        explorer = self.explorer

        def answer(progress=None) -> dict:
            c = explorer.causal(view, target, measure)
            return dict(target=c["target"], measure=c["measure"],
                        importance=encode(c["importance"]),
                        importance_kind=c["importance_kind"],
                        lens_prob=c["lens_prob"].tolist(), lens_top=c["lens_top"].tolist(),
                        lens_top_names=c["lens_top_names"])
        return answer

    def _importance(self, view: View, target, measure) -> Callable[..., dict]:
        explorer = self.explorer

        def answer(progress=None) -> dict:
            c = explorer.exact_importance(view, target, measure, progress)
            return dict(target=c["target"], measure=c["measure"],
                        importance=encode(c["importance"]), importance_kind="exact",
                        correlation_with_estimate=c["correlation_with_estimate"])
        return answer

    # --------------------------------------------------------------------- background jobs
    def start_job(self, request: Request) -> dict:
        """Start ``kind`` (faithfulness: the query of /api/faithfulness; importance: the exact
        head ablation, the query of /api/causal; causal: the logit lens and the estimate, the same
        query; methods: several maps, the query of
        /api/method with ``methods=a,b``) in the background; a newer job of the same
        kind supersedes it. Answers the job's id and state; poll GET /api/job?id=."""
        q = Query(request.query_params)
        kind = q.choice("kind", JOB_KINDS)
        if kind == "faithfulness":
            run = self._faithfulness(q)
        elif kind == "methods":
            run = self._methods(q)
        elif kind == "causal":
            run = self._causal(self._view(q), q.integer("target"),
                               q.choice("measure", MEASURES, "logit"))
        else:
            run = self._importance(self._view(q), q.integer("target"),
                                   q.choice("measure", MEASURES, "logit"))
        return self.explorer.jobs.submit(kind, run).summary()

    def _job(self, q: Query):
        job_id = q.text("id", missing="which job (the id POST /api/job answered)")
        job = self.explorer.jobs.get(job_id)
        if job is None:
            raise BadQuery(f"no job {job_id!r} here (never started, or long finished): start "
                           "it again")
        return job

    def job(self, request: Request) -> dict:
        """The job's state, fraction done and seconds left; its ``result`` once done, and
        before that any ``partial`` answer it has (the faithfulness curves, before the random
        maps and the sanity checks)."""
        job = self._job(Query(request.query_params))
        out = job.summary()
        if job.state == "done":
            out["result"] = job.result
        elif job.partial is not None:
            out["partial"] = job.partial
        return out

    def cancel_job(self, request: Request) -> dict:
        job = self._job(Query(request.query_params))
        self.explorer.jobs.cancel(job.id)
        return job.summary()

    # ---------------------------------------------------------------------- what it exports
    def export(self, request: Request) -> Response:
        q = Query(request.query_params)
        view, options = self._view(q), map_options(q)
        data = self.explorer.export_npz(view, q.text("method", "rollout"), q.integer("target"),
                                        q.settings(), **options)
        return Response(data, media_type="application/octet-stream", headers={
            "content-disposition": f'attachment; filename="vitkit-{view.id[:8]}.npz"'})


def add_routes(app: FastAPI, explorer: Explorer, samples: list[Sample],
               compare: Explorer | None = None) -> None:
    """Add every API route of ``explorer`` (and of ``compare``, with ``model=b``) and
    ``samples`` to ``app``."""
    api = Api(explorer, samples, compare)
    for method, url, handler in api.table():
        app.add_api_route(url, api._bind(handler), methods=[method])
