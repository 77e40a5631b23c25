"""The audit of a model over a dataset: predictions and relevance maps for every image, where the
relevance sits, SpRAy clusters per predicted class, flags confirmed by masking, and a suspicion
score per image.

``audit(model, split)`` streams the split in batches: each batch is read (an unreadable image
becomes a row with its error), preprocessed as every command does, run through the model once
for the maps (``explain_map``) and once for the token norms.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from vitkit.audit.flags import (
    SAME_PIXELS,
    Flag,
    confirm_region,
    fixed_region_flags,
    pixel_sameness,
)
from vitkit.audit.regions import CORNERS, border_mask, image_stats, shares
from vitkit.audit.spray import cluster
from vitkit.data.images import Preprocess, preprocessing
from vitkit.errors import DataError, ImageError
from vitkit.explain.registry import applicable, explain_map
from vitkit.explain.stats import outlier_tokens, token_norms

DEFAULT_METHOD = "cp-lrp"  # the most faithful method measured (docs/explain.md), any readout
BORDER_SHARE = 0.5  # a class whose maps put this much on the border ring (and 2x its area)
CONFIRM_IMAGES = 200  # images of the class, and of the others, masked to confirm a flag
HYPOTHESIS_WEIGHT = 0.25  # an unconfirmed pattern counts this much towards an image's suspicion


@dataclass
class Audit:
    """``rows``: one dict per image (index, label, prediction, confidence, correct, the region
    shares, entropy, high-norm tokens, cluster, suspicion: the share of its relevance on a
    flagged region of its predicted class, a quarter of it for an unconfirmed one, error);
    ``maps`` (n, gh, gw) float32 (NaN for unreadable images); ``clusters``: per predicted
    class, per cluster, its size, mean map (shares) and members; ``flags``: confirmed findings
    and hypotheses."""

    method: str
    rows: list[dict]
    maps: np.ndarray
    clusters: list[dict] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)


def _read(split, indices, transform) -> tuple[list[int], torch.Tensor, dict[int, str]]:
    ok, tensors, errors = [], [], {}
    for i in indices:
        try:
            img, _ = split[i]
            tensors.append(transform(img))
            ok.append(i)
        except (DataError, ImageError, OSError, ValueError) as err:
            errors[i] = str(err)
    return ok, (torch.stack(tensors) if tensors else torch.empty(0)), errors


def _images(split, indices, transform) -> torch.Tensor:
    return _read(split, indices, transform)[1]


def audit(model, split, *, method: str = DEFAULT_METHOD, batch_size: int = 64,
          max_clusters: int = 8, confirm_images: int = CONFIRM_IMAGES, seed: int = 0,
          progress: Callable[[int, int], None] | None = None) -> Audit:
    """Audit ``model`` on ``split`` (a :class:`~vitkit.data.datasets.Split`) with ``method``;
    ``progress(done, total)`` after each batch."""
    if method not in applicable(model.cfg):
        raise ValueError(f"method {method!r} does not apply to this model; methods that apply: "
                         f"{', '.join(applicable(model.cfg))}")
    model.eval()
    (size, _), mean, std = preprocessing(model)
    transform = Preprocess(size, mean, std)
    grid = tuple(model.grid_size)
    n = len(split)
    maps = np.full((n, *grid), np.nan, dtype=np.float32)
    rows: list[dict] = []
    boxes = getattr(split, "boxes", None)
    for start in range(0, n, batch_size):
        indices = list(range(start, min(n, start + batch_size)))
        ok, x, errors = _read(split, indices, transform)
        for i, err in errors.items():
            rows.append({"index": i, "label": int(split.labels[i]), "error": err})
        if ok:
            e = explain_map(model, x, method)
            probs = e.logits.softmax(-1)
            box = None
            if boxes is not None and tuple(x.shape[-2:]) == size:
                box = torch.as_tensor(boxes)[ok]
            stats = image_stats(e.map, box, size if box is not None else None)
            norms = token_norms(model, x)[-1]  # (B, T) at the last block
            for j, i in enumerate(ok):
                row = {"index": i, "label": int(split.labels[i]),
                       "prediction": int(e.target[j]),
                       "confidence": probs[j, e.target[j]].item(),
                       "correct": int(e.target[j]) == int(split.labels[i]),
                       **{k: v[j].item() for k, v in stats.items()},
                       "high_norm_tokens": len(outlier_tokens(norms[j])), "error": ""}
                rows.append(row)
                maps[i] = e.map[j].float().numpy()
        if progress is not None:
            progress(min(n, start + batch_size), n)
    rows.sort(key=lambda r: r["index"])
    result = Audit(method, rows, maps)
    _cluster_and_flag(model, split, transform, result, max_clusters, confirm_images, seed)
    return result


def _cluster_and_flag(model, split, transform, result: Audit, max_clusters: int,
                      confirm_images: int, seed: int) -> None:
    rows = [r for r in result.rows if not r["error"]]
    maps = torch.from_numpy(result.maps)
    by_class: dict[int, list[int]] = {}
    for r in rows:
        by_class.setdefault(r["prediction"], []).append(r["index"])
    class_means = {c: shares(maps[idx]).mean(0) for c, idx in by_class.items()}
    grid = tuple(maps.shape[-2:])
    for r in result.rows:
        r["cluster"], r["suspicion"] = -1, 0.0
    for c, idx in sorted(by_class.items()):
        found = cluster(maps[idx], max_clusters=max_clusters, seed=seed)
        means = []
        for k in range(found.k):
            members = [idx[j] for j in np.flatnonzero(found.labels == k)]
            for i in members:
                result.rows[i]["cluster"] = k
            mean = shares(maps[members]).mean(0)
            means.append(mean)
            result.clusters.append({"class": c, "cluster": k, "size": len(members),
                                    "mean_map": mean.tolist(), "members": members})
        others = [m for d, m in class_means.items() if d != c]
        elsewhere = torch.stack(others).mean(0) if others else torch.full(grid, 1 / maps[0].numel())
        result.flags += fixed_region_flags(c, means, elsewhere)
        border = border_mask(grid)
        on_border = (class_means[c] * border).sum().item()
        if on_border >= BORDER_SHARE and on_border >= 2 * border.float().mean().item():
            result.flags.append(Flag(
                "border", c, evidence=(f"the maps of class {c} put {on_border:.0%} of their "
                                       f"relevance on the border ring ({border.float().mean():.0%}"
                                       " of the image)"),
                fix="check the class's images for frames, padding or scanner edges; crop or "
                    "pad all classes alike", region=border))
    _confirm(model, split, transform, result, confirm_images, seed)
    for r in result.rows:
        if r["error"]:
            continue
        m = shares(maps[r["index"]][None])[0]
        for f in result.flags:
            if f.cls == r["prediction"] and f.region is not None:
                weight = 1.0 if f.confirmed else HYPOTHESIS_WEIGHT
                r["suspicion"] = max(r["suspicion"], weight * (m * f.region).sum().item())


def _confirm(model, split, transform, result: Audit, limit: int, seed: int) -> None:
    g = np.random.default_rng(seed)
    labels = np.asarray(split.labels)
    for f in result.flags:
        if f.region is None:
            continue
        own = np.flatnonzero(labels == f.cls)
        rest = np.flatnonzero(labels != f.cls)
        own = g.permutation(own)[:limit].tolist()
        rest = g.permutation(rest)[:limit].tolist()
        if f.cluster is not None:
            members = next(c["members"] for c in result.clusters
                           if c["class"] == f.cls and c["cluster"] == f.cluster)
        else:
            members = [r["index"] for r in result.rows if r.get("prediction") == f.cls]
        mass = [(shares(torch.from_numpy(result.maps[i])[None])[0] * f.region).sum().item()
                for i in members]
        donor = _images(split, [members[int(np.argmax(mass))]], transform)
        class_images = _images(split, own, transform)
        confirmed, effect = confirm_region(
            model, f.cls, class_images, torch.full((len(class_images),), f.cls), donor[0],
            _images(split, rest, transform), f.region)
        if f.kind == "fixed-region":  # a fixed thing looks alike on every image of the cluster
            sample = g.permutation(members)[:limit].tolist()
            effect["pixel_deviation"] = pixel_sameness(_images(split, sample, transform),
                                                       f.region)
            confirmed = confirmed and effect["pixel_deviation"] <= SAME_PIXELS
        f.confirmed, f.effect = confirmed, {**f.effect, **effect}


__all__ = ["Audit", "audit", "CORNERS", "DEFAULT_METHOD"]
