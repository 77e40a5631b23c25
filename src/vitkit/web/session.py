"""The explorer's state: one model, the images it has seen, and what was computed for them.

An image is analysed once: preprocessed as every command does it, one forward with every
layer's maps. What the page asks next (another layer, head or patch, a method, the curves, the
per-head numbers, the causal tables) is computed by :mod:`vitkit.explain` from that analysis
and kept in a bounded LRU cache (:mod:`vitkit.web.cache`: bytes and entries), so repeated
interactions cost a lookup.

Model work runs under one lock (re-entrant: a job holds it while its steps compute through the
same cached helpers): hooks (Grad-CAM, head ablation, token norms) are per-module, and two
threads must never see each other's. The first view of an image (its forward with every
layer's maps, its token norms) runs on a twin of the model (:func:`twin`: its own modules over
the same weight tensors, so no hook set on the model reaches it) under a lock of its own that
only these short forwards take: a new image never waits behind a gradient method or a job.
What needs only the attention maps already computed (the heads, rollout, [CLS] and MAP
attention) takes no lock at all. Slow work (faithfulness, the exact head ablation, the
gradient methods) runs as a background job (:mod:`vitkit.web.jobs`) with progress and cancel.
Nothing here knows about HTTP.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import io
import json
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from vitkit import explain
from vitkit.data.images import cover, crop_box, decode_image, preprocess, preprocessing
from vitkit.errors import VitkitError
from vitkit.explain import causal, dense, stats, trust
from vitkit.explain.attention import HEAD_FUSIONS
from vitkit.explain.methods import METHODS, applicable
from vitkit.explain.perturb import deletion_insertion, random_maps
from vitkit.models.cnn import is_cnn
from vitkit.web import checks
from vitkit.web.cache import LRU, cache_budget, nbytes
from vitkit.web.jobs import Jobs


def twin(model):
    """A second module tree over the same parameter and buffer tensors as ``model`` (no copy
    of the weights): hooks and patched forwards are per module, so the twin's forwards never
    meet the ones another thread set on ``model``."""
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, shared).eval()


def is_constant(m: torch.Tensor) -> bool:
    """Whether a map holds one value everywhere (all zeros included)."""
    return bool(m.numel() == 0 or (m.max() - m.min()).abs().item() == 0)


def constant_note(method: str, m: torch.Tensor) -> str:
    value = float(m.flatten()[0]) if m.numel() else 0.0
    return (f"the {method} map is constant ({value:g} on every patch): it ranks no patch above "
            "another, so it explains nothing here and gets no faithfulness score; try another "
            "class or method")


MAX_ASPECT = 20  # a longer side more than this many times the shorter: refused


class NotFound(VitkitError):
    """An image id the explorer does not hold (never seen, or evicted from the cache)."""


@dataclass
class View:
    """One analysed image: ``x`` (1, C, H, W) as the model takes it, ``picture`` (H, W, 3)
    uint8 as the model sees it, ``logits`` (1, classes), ``maps`` every layer's
    (1, heads, T, T), and the object's box (x0, y0, x1, y1) in input pixels when known."""

    id: str
    x: torch.Tensor
    picture: np.ndarray
    logits: torch.Tensor
    maps: list
    box: tuple[int, int, int, int] | None = None


class Explorer:
    """The explorer of one model. ``cache_mb`` bounds the memory kept for images and results;
    ``max_pixels`` the size of an image accepted."""

    def __init__(self, model, *, cache_mb: int = 512, max_pixels: int = 40_000_000,
                 max_entries: int = 256, name: str | None = None) -> None:
        if is_cnn(model):
            raise VitkitError(f"the explorer looks inside a ViT; this checkpoint is a CNN "
                              f"({model.cfg.arch}). Use `vitkit predict` for its predictions.")
        self.model = model.eval()
        self.cfg = model.cfg
        c = model.cfg
        self.name = name or c.extra.get("name") or \
            f"ViT depth {c.depth}, width {c.embed_dim}, patch {c.patch_size}"
        self.size, self.mean, self.std = preprocessing(model)
        self.max_pixels = max_pixels
        t = self.cfg.num_prefix_tokens + self.grid[0] * self.grid[1]
        view_bytes = 4 * self.depth * self.heads * t * t  # float32 (layers, heads, T, T)
        self.cache = LRU(cache_budget(cache_mb, view_bytes), max_entries)
        self.lock = threading.RLock()  # one model, one computation at a time
        self.jobs = Jobs(self.lock)
        self.viewer = twin(self.model)  # first views: the same weights, other modules
        self.view_lock = threading.Lock()  # the twin's token-norm hooks vs its forwards
        self.has_classifier = self.cfg.num_classes > 0

    # ----------------------------------------------------------------------- what it is
    @property
    def depth(self) -> int:
        return len(self.model.blocks)

    @property
    def heads(self) -> int:
        return self.cfg.num_heads

    @property
    def grid(self) -> tuple[int, int]:
        return self.cfg.grid_size

    def class_names(self) -> list[str]:
        """The ``num_classes`` class names (the checkpoint's, or "class i")."""
        return checks.class_names(self.cfg)

    def token_names(self) -> list[str]:
        """Names of the prefix tokens, in sequence order ([CLS], [DIST], [REG0], ...)."""
        return checks.token_names(self.cfg)

    def unavailable(self) -> dict[str, str]:
        """Methods (and views) that do not apply to this model -> the reason."""
        return checks.unavailable_methods(self.cfg, self.has_classifier)

    def info(self) -> dict:
        """What the page shows of the model: sizes, names, methods (JSON-ready)."""
        unavailable = self.unavailable()
        return dict(
            name=self.name,
            depth=self.depth, heads=self.heads, grid=list(self.grid),
            patch_size=self.cfg.patch_size, input=list(self.size), pool=self.cfg.pool,
            prefix_tokens=self.token_names(), classes=self.class_names(),
            methods={name: m.summary for name, m in METHODS.items()},
            method_info={name: dict(gradients=m.gradients, options=list(m.options))
                         for name, m in METHODS.items()},
            applicable=[m for m in applicable(self.cfg) if m not in unavailable],
            unavailable=unavailable, has_classifier=self.has_classifier,
            fusions=list(HEAD_FUSIONS),
            features=None if importlib.util.find_spec("sklearn") else dense.NEEDS_SKLEARN,
        )

    # ------------------------------------------------------------------------ images in
    def add(self, data: bytes, name: str = "the image", box=None) -> View:
        """Decode, preprocess and analyse an image (bytes of any format Pillow reads)."""
        img = decode_image(data, self.max_pixels, name)
        return self.add_image(img, box, key=hashlib.sha256(data).hexdigest()[:24])

    def add_image(self, img: Image.Image, box=None, key: str | None = None) -> View:
        """Analyse an RGB PIL image; ``box`` (x0, y0, x1, y1) in its pixels, if known."""
        if key is None:
            key = hashlib.sha256(img.tobytes() + str(img.size).encode()).hexdigest()[:24]
        found = self.cache.get(("view", key))
        if found is not None:
            return found
        _, new_h, new_w, _, _ = cover(img.size, self.size)
        aspect = max(img.width, img.height) / max(1, min(img.width, img.height))
        if aspect > MAX_ASPECT:
            raise VitkitError(f"an image of {img.width}x{img.height} has an aspect ratio of "
                              f"{aspect:.0f}:1, more than {MAX_ASPECT}:1: the centre crop the "
                              "model sees would keep a sliver of it; crop it first")
        if new_h * new_w > self.max_pixels:
            raise VitkitError(f"an image of {img.width}x{img.height} would be resized to "
                              f"{new_w}x{new_h} before the centre crop: its aspect ratio is "
                              "too extreme; crop it first")
        x, seen = preprocess(img, self.size, self.mean, self.std)  # seen: (H, W, 3) in [0, 1]
        picture = (seen * 255).round().astype(np.uint8)
        if box is not None:
            box = crop_box(box, img.size, self.size)
        with self.view_lock, torch.no_grad():
            found = self.cache.get(("view", key))  # another request may have just done it
            if found is not None:
                return found
            logits, maps = self.viewer(x[None], return_attn=True)
        view = View(key, x[None], picture, logits, maps, box)
        self.cache.put(("view", key), view,
                       nbytes([view.x, view.picture, view.logits, *maps]))
        return view

    def view(self, image_id: str) -> View:
        """The analysed image ``image_id`` (:attr:`View.id`); NotFound when not held."""
        found = self.cache.get(("view", image_id))
        if found is None:
            raise NotFound(f"no image {image_id!r} here (never sent, or dropped from the "
                           "cache): send the image again")
        return found

    # ---------------------------------------------------------------------- what it shows
    def _layer_head(self, layer: int, head: int | str) -> tuple[int, int | str]:
        return checks.layer_index(layer, self.depth), checks.head_choice(head, self.heads)

    def _class(self, target: int | None, view: View) -> int:
        return checks.class_index(target, view.logits, self.has_classifier)

    def _cached(self, key: tuple, compute: Callable, locked: bool = True):
        """The value under ``key``, or ``compute()`` stored there (under the model lock when
        ``locked``: it runs the model or sets hooks)."""
        found = self.cache.get(key)
        if found is not None:
            return found
        if locked:
            with self.lock:
                found = self.cache.get(key)  # another request may have just computed it
                if found is not None:
                    return found
                value = compute()
        else:
            value = compute()
        self.cache.put(key, value, nbytes(value))
        return value

    def top(self, view: View, k: int = 5) -> list[dict]:
        if not self.has_classifier:
            return []
        probs = view.logits[0].softmax(-1)
        values, idx = probs.topk(min(k, probs.numel()))
        names = self.class_names()
        return [dict(index=int(i), name=names[int(i)], prob=float(p))
                for p, i in zip(values, idx, strict=True)]

    def model_view(self, view: View) -> torch.Tensor:
        """(layers, heads, gh, gw): every head of every layer, the readout's rows."""
        return self._cached(("heads", view.id),
                            lambda: explain.readout_attention(view.maps)[0], locked=False)

    def fused_view(self, view: View, fusion: str) -> torch.Tensor:
        """(layers, gh, gw): the model view's heads fused by name (mean, max or min)."""
        return explain.fuse_heads(self.model_view(view), checks.fusion_name(fusion))

    def rollout_matrix(self, view: View, residual: float, fusion: str,
                       discard_ratio: float) -> torch.Tensor:
        """(T, T) attention rollout of the image."""
        return self._cached(("rollout", view.id, residual, fusion, discard_ratio),
                            lambda: explain.attention_rollout(
                                view.maps, residual, fusion, discard_ratio)[0], locked=False)

    def token_row(self, view: View, token: int, layer: int, head, *, residual: float = 0.5,
                  fusion: str = "mean", discard_ratio: float = 0.0) -> dict:
        """Where ``token`` looks at ``layer`` and ``head`` (T,), and its rollout row (T,)."""
        checks.token_index(token, view.maps[0].shape[-1], len(self.token_names()), self.grid)
        layer, head = self._layer_head(layer, head)
        checks.rollout_settings(residual, fusion, discard_ratio)
        row = explain.token_attention(view.maps, token, layer, head)[0]
        roll = self.rollout_matrix(view, residual, fusion, discard_ratio)[token]
        return dict(row=row, rollout=roll)

    def explained_class(self, shown) -> int | None:
        """The class ``shown`` (a :meth:`method_map`) explains: None for a class-agnostic map
        (rollout, [CLS] attention) and for a model without a classifier head."""
        explains = self.has_classifier and METHODS[shown.method].gradients
        return int(shown.target[0]) if explains else None

    def method_map(self, view: View, method: str, target: int | None, *, layer: int = -1,
                   head="mean", residual: float = 0.5, fusion: str = "mean",
                   discard_ratio: float = 0.0) -> explain.Explanation:
        """``method``'s (gh, gw) map for ``target`` (the prediction when None)."""
        method = checks.method_name(method, self.cfg, self.unavailable())
        layer, head = self._layer_head(layer, head)
        m = METHODS[method]
        if m.gradients:
            target = self._class(target, view)
        elif target is not None:  # a class-agnostic map; a class that does not exist is
            self._class(target, view)  # still a mistake to report
            target = None
        checks.rollout_settings(residual, fusion, discard_ratio)
        used = dict(layer=layer, head=head, residual=residual, discard_ratio=discard_ratio,
                    head_fusion=fusion)
        key_opts = tuple(sorted((k, v) for k, v in used.items() if k in m.options))
        key = ("method", view.id, method, target, key_opts)
        return self._cached(key, lambda: explain.explain_map(
            self.model, view.x, method, target=target, outputs=(view.logits, view.maps),
            budget=True, **used), locked=m.gradients)  # attention-only maps read the stored maps

    def faithfulness(self, view: View, method: str, target: int | None, steps: int = 16,
                     progress: Callable[[float], None] | None = None, **options) -> dict:
        """Deletion and insertion curves of ``method``'s map and of a random map, the map's
        rank among 20 random maps, and the model-randomisation and class-sensitivity checks
        (vitkit.explain.trust): the page's "how far to trust" verdict. ``progress(fraction)``
        between the steps, the curves as a first part of the answer (``progress(fraction,
        partial)``) before the 20 random maps and the sanity checks. A constant map (all
        zeros included) ranks no patch above another: it gets no score, and the error says
        so."""
        if not self.has_classifier:
            raise VitkitError(checks.NO_HEAD)
        tick = progress or (lambda fraction, partial=None: None)
        shown = self.method_map(view, method, target, **options)
        if is_constant(shown.map):
            raise VitkitError(constant_note(method, shown.map))
        cls = int(shown.target[0])
        key = ("faith", view.id, method, cls, tuple(sorted(options.items())), steps)

        def compute():
            tick(0.05)
            maps = torch.cat([shown.map, random_maps(shown.map)])
            curves = deletion_insertion(self.model, view.x.expand(2, -1, -1, -1), maps,
                                        torch.tensor([cls, cls]), steps=steps,
                                        baseline=trust.VERDICT_BASELINE)
            tick(0.2, dict(target=cls, baseline=curves.baseline,  # drawn at once
                           fractions=curves.fractions.tolist(),
                           deletion=curves.deletion.tolist(), insertion=curves.insertion.tolist(),
                           deletion_auc=curves.deletion_auc.tolist(),
                           insertion_auc=curves.insertion_auc.tolist()))
            floor = trust.random_floor(self.model, view.x, shown.map, shown.target,
                                       steps=steps, baseline=trust.VERDICT_BASELINE,
                                       own_auc=curves.deletion_auc[:1])
            tick(0.45)
            used = {k: v for k, v in options.items() if k in METHODS[method].options}
            randomised = trust.randomisation_check(self.model, view.x, method,
                                                   target=shown.target, **used)
            tick(0.85)
            sensitive = trust.class_sensitivity(self.model, view.x, method, **used)
            percentile = float(floor.percentile[0])
            said = trust.verdict(percentile, randomised.passes, sensitive.passes)
            return dict(baseline=trust.VERDICT_BASELINE, fractions=curves.fractions,
                        deletion=curves.deletion,
                        insertion=curves.insertion, deletion_auc=curves.deletion_auc,
                        insertion_auc=curves.insertion_auc, target=cls,
                        percentile=percentile, p_value=float(floor.p_value[0]),
                        random_maps=floor.random.shape[1],
                        randomisation=dict(passes=randomised.passes,
                                           correlation=randomised.correlation[-1]),
                        class_sensitivity=dict(passes=sensitive.passes,
                                               correlation=float(sensitive.correlation[0])),
                        verdict=dict(trusted=said.trusted, fails=said.fails, text=said.text))
        return self._cached(key, compute)

    def head_stats(self, view: View) -> dict:
        """Entropy (nats) and mean attention distance (pixels) per layer and head, the
        distance uniform attention would give, and tokens with outlying norms per layer."""
        def compute():
            with self.view_lock:  # the twin: never behind a job on the model
                norms = stats.token_norms(self.viewer, view.x)[:, 0]  # (L, T)
            outliers = [dict(layer=layer, token=int(t), norm=float(norms[layer, t]),
                             median=float(norms[layer].median()))
                        for layer in range(len(norms))
                        for t in stats.outlier_tokens(norms[layer])]
            return dict(
                entropy=stats.attention_entropy(view.maps),
                distance=stats.mean_attention_distance(
                    view.maps, self.grid, self.cfg.patch_size, self.model.num_prefix_tokens),
                uniform_distance=stats.uniform_distance(self.grid, self.cfg.patch_size),
                max_entropy=math.log(view.maps[0].shape[-1]),
                norms=norms, outliers=outliers)
        return self._cached(("stats", view.id), compute, locked=False)

    def patch_tokens(self, view: View) -> torch.Tensor:
        """(gh, gw, D): the patch tokens after the final norm (on the twin: never behind a
        job on the model)."""
        def compute():
            with self.view_lock, torch.no_grad():
                return dense.patch_features(self.viewer, view.x)[0][0]
        return self._cached(("tokens", view.id), compute, locked=False)

    def features_view(self, view: View) -> dict:
        """The features view: the PCA picture ``rgb`` (gh, gw, 3) in [0, 1] (this image
        alone, :func:`vitkit.explain.dense.feature_pca`), its ``foreground`` (gh, gw), the
        ``explained`` variance ratios, ``first_explained``, the ``threshold``, and the high-norm
        ``artifacts`` among the patches (last block, as [row, col])."""
        def compute():
            p = dense.feature_pca(self.patch_tokens(view)[None])
            norms = self.head_stats(view)["norms"][-1:]  # (1, T): the last block's output
            marked = dense.artifact_patches(norms, self.model.num_prefix_tokens, self.grid)[0]
            return dict(rgb=torch.from_numpy(p.rgb[0]),
                        foreground=torch.from_numpy(p.foreground[0]).float(),
                        explained=p.explained[0].tolist(),
                        first_explained=float(p.first_explained[0]), threshold=p.threshold,
                        artifacts=marked.nonzero().tolist())
        return self._cached(("pca", view.id), compute, locked=False)

    def similarity(self, view: View, row: int, col: int) -> torch.Tensor:
        """(gh, gw): the cosine similarity of patch (``row``, ``col``) with every patch."""
        dense.check_patch(row, col, self.grid)
        return self._cached(("similar", view.id, row, col), lambda: dense.patch_similarity(
            self.patch_tokens(view)[None], row, col)[0], locked=False)

    def causal(self, view: View, target: int | None, measure: str = "logit") -> dict:
        """The logit lens (per layer: the target's probability, the top class; one forward)
        and every head's importance for ``target`` estimated by attribution patching (one
        forward and one backward): what the page shows at once."""
        target = self._class(target, view)
        checks.measure_name(measure)

        def compute():
            lens = causal.logit_lens(self.model, view.x)[:, 0]  # (L, C)
            probs = lens.softmax(-1)
            estimate, _ = causal.head_importance_estimate(self.model, view.x, target, measure)
            names = self.class_names()
            return dict(target=target, measure=measure, importance=estimate[0],
                        importance_kind="estimate", lens_prob=probs[:, target],
                        lens_top=probs.argmax(-1),
                        lens_top_names=[names[int(i)] for i in probs.argmax(-1)])
        return self._cached(("causal", view.id, target, measure), compute)

    def exact_importance(self, view: View, target: int | None, measure: str = "logit",
                         progress: Callable[[float], None] | None = None) -> dict:
        """Every head's importance for ``target`` by ablation (one forward per layer),
        ``progress(fraction)`` after each layer: the exact numbers the estimate approximates,
        and their rank correlation with the estimate (Spearman, ties at their mean rank)."""
        target = self._class(target, view)
        checks.measure_name(measure)

        def compute():
            drops, _ = causal.head_importance(self.model, view.x, target, measure,
                                              progress=progress)
            estimate = self.causal(view, target, measure)["importance"]
            rho = trust.rank_correlation(drops[0][None], estimate[None])
            return dict(target=target, measure=measure, importance=drops[0],
                        importance_kind="exact", correlation_with_estimate=float(rho[0]))
        return self._cached(("exact-importance", view.id, target, measure), compute)

    # ---------------------------------------------------------------------- what it exports
    def export_arrays(self, view: View, method: str, target: int | None,
                      settings: dict | None = None, **options) -> dict[str, np.ndarray]:
        """What the page shows of ``view``, as arrays: ``picture`` (H, W, 3) uint8, ``logits``
        (classes,), ``heads`` (layers, heads, gh, gw), ``attention`` (layers, heads, T, T),
        ``method_map`` (gh, gw) of ``method`` for ``target`` with ``options`` (as
        :meth:`method_map`), ``target`` () the class it was computed for, and ``settings`` ()
        the JSON text of ``settings`` (what the page asked for)."""
        shown = self.method_map(view, method, target, **options)
        return dict(
            picture=view.picture, logits=view.logits[0].numpy(),
            heads=self.model_view(view).numpy(),
            attention=np.stack([m[0].numpy() for m in view.maps]),
            method_map=shown.map[0].numpy(), target=np.array(int(shown.target[0])),
            settings=np.array(json.dumps(settings or {})))

    def export_npz(self, view: View, method: str, target: int | None,
                   settings: dict | None = None, **options) -> bytes:
        """:meth:`export_arrays` as the bytes of a compressed ``.npz`` file."""
        buf = io.BytesIO()
        np.savez_compressed(buf, **self.export_arrays(view, method, target, settings,
                                                      **options))
        return buf.getvalue()
