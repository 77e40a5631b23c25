"""The audit of a model over a dataset: predictions and relevance maps for every image, where the
relevance sits, SpRAy clusters per predicted class, flags confirmed by masking, and a suspicion
score per image.

``audit(model, split)`` is the two halves in one process: :func:`scan` streams images in
batches (an unreadable image becomes a row with its error), preprocessed as every command does,
and runs each batch through the model once, for the maps (``explain_map``) and the token norms
of the last block (a forward hook on the same pass); :func:`finish` clusters, flags, confirms
and scores. :mod:`vitkit.audit.store` runs the scan in shards, resumable and over torchrun ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from vitkit.audit.flags import (
    SAME_PIXELS,
    Flag,
    confirm_outside_box,
    confirm_region,
    fixed_region_flags,
    outside_box_flag,
    pixel_sameness,
)
from vitkit.audit.regions import CORNERS, border_mask, image_stats, shares
from vitkit.audit.spray import cluster, features
from vitkit.data.images import Preprocess, preprocessing
from vitkit.errors import ConfigError, DataError, ImageError
from vitkit.explain.registry import applicable, explain_map
from vitkit.explain.stats import outlier_tokens, token_norms

DEFAULT_METHOD = "cp-lrp"  # the most faithful method measured (docs/explain.md), any readout
BORDER_SHARE = 0.5  # a class whose maps put this much on the border ring (and 2x its area)
CONFIRM_IMAGES = 200  # images of the class, and of the others, masked to confirm a flag
HYPOTHESIS_WEIGHT = 0.25  # an unconfirmed pattern counts this much towards an image's suspicion
TYPICAL = 8  # a cluster's most typical images, shown in the report


@dataclass
class Audit:
    """``rows``: one dict per image (index, label, prediction, confidence, correct, the region
    shares, entropy, high-norm tokens, cluster, suspicion: the share of its relevance on a
    flagged region of its predicted class, a quarter of it for an unconfirmed one, error);
    ``maps`` (n, gh, gw) float32 (NaN for unreadable images); ``clusters``: per predicted
    class, per cluster, its size, mean map (shares), members and most typical members;
    ``flags``: confirmed findings and hypotheses."""

    method: str
    rows: list[dict]
    maps: np.ndarray
    clusters: list[dict] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    split: object = None  # the data audited, where the audit keeps it (vitkit.audit.store)


def check_method(model, method: str) -> None:
    if method not in applicable(model.cfg):
        raise ConfigError(f"method {method!r} does not apply to this model; methods that apply: "
                         f"{', '.join(applicable(model.cfg))}")


def transform_for(model) -> Preprocess:
    (size, _), mean, std = preprocessing(model)
    return Preprocess(size, mean, std)


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


def _maps_and_norms(model, x: torch.Tensor, method: str):
    """The explanation of ``x`` and the token norms (B, T) at the last block, from the same
    forward where the method runs the standard blocks (otherwise one more forward)."""
    caught: list[torch.Tensor] = []

    def hook(module, args, out):
        caught.append((out[0] if isinstance(out, tuple) else out).detach().norm(dim=-1))

    handle = model.blocks[-1].register_forward_hook(hook)
    try:
        e = explain_map(model, x, method)
    finally:
        handle.remove()
    norms = caught[0] if len(caught) == 1 and caught[0].shape[0] == len(x) else None
    if norms is None:
        with torch.no_grad():
            norms = token_norms(model, x)[-1]
    return e, norms


def scan(model, split, indices: list[int], method: str, batch_size: int = 64,
         device: torch.device | str = "cpu") -> tuple[list[dict], np.ndarray]:
    """Rows and maps ((len(indices), gh, gw) float32, NaN for an unreadable image) of the images
    ``indices`` of ``split``, in batches of ``batch_size`` taken in order."""
    transform = transform_for(model)
    size = tuple(transform.size)
    grid = tuple(model.grid_size)
    maps = np.full((len(indices), *grid), np.nan, dtype=np.float32)
    where = {i: j for j, i in enumerate(indices)}
    rows: list[dict] = []
    boxes = getattr(split, "boxes", None)
    for start in range(0, len(indices), batch_size):
        ok, x, errors = _read(split, indices[start:start + batch_size], transform)
        for i, err in errors.items():
            rows.append({"index": i, "label": int(split.labels[i]), "error": err})
        if not ok:
            continue
        e, norms = _maps_and_norms(model, x.to(device), method)
        target, probs = e.target.cpu(), e.logits.detach().float().softmax(-1).cpu()
        emap = e.map.detach().float().cpu()
        box = None
        if boxes is not None and tuple(x.shape[-2:]) == size:
            box = torch.as_tensor(np.asarray(boxes))[ok]
        stats = image_stats(emap, box, size if box is not None else None)
        for j, i in enumerate(ok):
            label = int(split.labels[i])
            rows.append({"index": i, "label": label, "prediction": int(target[j]),
                         "confidence": probs[j, target[j]].item(),
                         "correct": int(target[j]) == label if label >= 0 else None,
                         **{k: v[j].item() for k, v in stats.items()},
                         "high_norm_tokens": len(outlier_tokens(norms[j].cpu())), "error": ""})
            maps[where[i]] = emap[j].numpy()
    rows.sort(key=lambda r: where[r["index"]])
    return rows, maps


def audit(model, split, *, method: str = DEFAULT_METHOD, batch_size: int = 64,
          max_clusters: int = 8, confirm_images: int = CONFIRM_IMAGES, seed: int = 0,
          progress: Callable[[int, int], None] | None = None) -> Audit:
    """Audit ``model`` on ``split`` (a :class:`~vitkit.data.datasets.Split`) with ``method``
    in one process; ``progress(done, total)`` after each batch."""
    check_method(model, method)
    model.eval()
    n = len(split)
    rows: list[dict] = []
    maps = []
    for start in range(0, n, batch_size):
        r, m = scan(model, split, list(range(start, min(n, start + batch_size))), method,
                    batch_size)
        rows += r
        maps.append(m)
        if progress is not None:
            progress(min(n, start + batch_size), n)
    grid = tuple(model.grid_size)
    result = Audit(method, rows, np.concatenate(maps) if maps else np.zeros((0, *grid),
                                                                            np.float32))
    return finish(model, split, result, max_clusters=max_clusters,
                  confirm_images=confirm_images, seed=seed)


def finish(model, split, result: Audit, *, max_clusters: int = 8,
           confirm_images: int = CONFIRM_IMAGES, seed: int = 0) -> Audit:
    """Cluster the maps of ``result`` per predicted class, flag, confirm by masking and score
    each image's suspicion (in place; returns ``result``)."""
    model.eval()
    transform = transform_for(model)
    rows = [r for r in result.rows if not r["error"]]
    maps = torch.from_numpy(result.maps)
    grid = tuple(maps.shape[-2:])
    by_class: dict[int, list[int]] = {}
    for r in rows:
        by_class.setdefault(r["prediction"], []).append(r["index"])
    class_means = {c: shares(maps[idx]).mean(0) for c, idx in by_class.items()}
    for r in result.rows:
        r["cluster"], r["suspicion"] = -1, 0.0
    for c, idx in sorted(by_class.items()):
        found = cluster(maps[idx], max_clusters=max_clusters, seed=seed)
        means, sizes = [], []
        for k in range(found.k):
            members = [idx[j] for j in np.flatnonzero(found.labels == k)]
            for i in members:
                result.rows[i]["cluster"] = k
            mean = shares(maps[members]).mean(0)
            means.append(mean)
            sizes.append(len(members))
            result.clusters.append({"class": c, "cluster": k, "size": len(members),
                                    "mean_map": mean.tolist(), "members": members,
                                    "typical": _typical(maps[members], members)})
        others = [m for d, m in class_means.items() if d != c]
        elsewhere = torch.stack(others).mean(0) if others else torch.full(grid, 1 / maps[0].numel())
        result.flags += fixed_region_flags(c, means, elsewhere, sizes)
        border = border_mask(grid)
        on_border = (class_means[c] * border).sum().item()
        if on_border >= BORDER_SHARE and on_border >= 2 * border.float().mean().item():
            result.flags.append(Flag(
                "border", c, evidence=(f"the maps of class {c} put {on_border:.0%} of their "
                                       f"relevance on the border ring ({border.float().mean():.0%}"
                                       " of the image)"),
                fix="check the class's images for frames, padding or scanner edges; crop or "
                    "pad all classes alike", region=border))
        in_box = [result.rows[i].get("in_box") for i in idx]
        if all(v is not None for v in in_box):
            flag = outside_box_flag(c, np.asarray(in_box, dtype=np.float64))
            if flag is not None:
                result.flags.append(flag)
    _confirm(model, split, transform, result, confirm_images, seed)
    for r in result.rows:
        if r["error"]:
            continue
        m = shares(maps[r["index"]][None])[0]
        for f in result.flags:
            if f.cls != r["prediction"]:
                continue
            weight = 1.0 if f.confirmed else HYPOTHESIS_WEIGHT
            mass = (1 - r["in_box"]) if f.kind == "outside-box" else (m * f.region).sum().item()
            r["suspicion"] = max(r["suspicion"], weight * mass)
    return result


def _typical(maps: torch.Tensor, members: list[int], count: int = TYPICAL) -> list[int]:
    """The ``count`` members whose downsampled shares lie closest to the cluster's mean."""
    x = features(maps)
    distance = np.linalg.norm(x - x.mean(0), axis=1)
    return [members[j] for j in np.argsort(distance, kind="stable")[:count]]


def _labels(result: Audit, split) -> np.ndarray:
    """Each image's label, its prediction where the data has none (a folder without classes)."""
    labels = np.asarray(split.labels, dtype=np.int64).copy()
    for r in result.rows:
        if labels[r["index"]] < 0 and not r["error"]:
            labels[r["index"]] = r["prediction"]
    return labels


def _confirm(model, split, transform, result: Audit, limit: int, seed: int) -> None:
    g = np.random.default_rng(seed)
    labels = _labels(result, split)
    readable = np.asarray([not r["error"] for r in result.rows])
    cache: dict[int, tuple[list[int], list[int]]] = {}
    for f in result.flags:
        if f.kind == "border":  # a pattern of a class's framing, not one region to paste
            continue
        if f.cls not in cache:
            own = g.permutation(np.flatnonzero((labels == f.cls) & readable))[:limit].tolist()
            rest = g.permutation(np.flatnonzero((labels != f.cls) & readable))[:limit].tolist()
            cache[f.cls] = own, rest
        own, rest = cache[f.cls]
        class_images = _images(split, own, transform)
        other_images = _images(split, rest, transform)
        if f.kind == "outside-box":
            boxes = torch.as_tensor(np.asarray(split.boxes))
            confirmed, effect = confirm_outside_box(
                model, f.cls, class_images, torch.as_tensor(labels[own]), boxes[own],
                other_images, torch.as_tensor(labels[rest]), boxes[rest])
            f.confirmed, f.effect = confirmed, {**f.effect, **effect}
            continue
        if f.cluster is not None:
            members = next(c["members"] for c in result.clusters
                           if c["class"] == f.cls and c["cluster"] == f.cluster)
        else:
            members = [r["index"] for r in result.rows if r.get("prediction") == f.cls]
        mass = [(shares(torch.from_numpy(result.maps[i])[None])[0] * f.region).sum().item()
                for i in members]
        donor = _images(split, [members[int(np.argmax(mass))]], transform)
        confirmed, effect = confirm_region(
            model, f.cls, class_images, torch.full((len(class_images),), f.cls), donor[0],
            other_images, f.region)
        if f.kind == "fixed-region":  # a fixed thing looks alike on every image of the cluster
            sample = g.permutation(members)[:limit].tolist()
            effect["pixel_deviation"] = pixel_sameness(_images(split, sample, transform),
                                                       f.region)
            confirmed = confirmed and effect["pixel_deviation"] <= SAME_PIXELS
        f.confirmed, f.effect = confirmed, {**f.effect, **effect}


__all__ = ["Audit", "audit", "scan", "finish", "CORNERS", "DEFAULT_METHOD"]
