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
    MIN_CLUSTER,
    Flag,
    confirm_outside_box,
    examine_region,
    outside_box_flag,
    pixel_mask,
    region_flag,
)
from vitkit.audit.regions import CORNERS, image_stats, shares
from vitkit.audit.spray import cluster, features
from vitkit.audit.statistics import STATISTICS, examine_statistic, neutralised_drop, statistic_flag
from vitkit.data.images import Preprocess, preprocessing
from vitkit.errors import ConfigError, DataError, ImageError
from vitkit.explain.perturb import noisy_linear_fill
from vitkit.explain.registry import applicable, explain_map
from vitkit.explain.stats import outlier_tokens, token_norms

DEFAULT_METHOD = "cp-lrp"  # the most faithful method measured (docs/explain.md), any readout
CONFIRM_IMAGES = 200  # images of the class, and of the others, changed to test a hypothesis
DONORS = 16  # the images a region is pasted from: those with the most relevance on it
HYPOTHESIS_WEIGHT = 0.25  # an unsettled pattern counts this much towards an image's suspicion
TYPICAL = 8  # a cluster's most typical images, shown in the report
REFERENCE = 256  # other classes' images: their mean reliance on a pattern is suspicion's zero


@dataclass
class Audit:
    """``rows``: one dict per image (index, label, prediction, confidence, correct, the region
    shares, entropy, high-norm tokens, cluster, suspicion: how much more its prediction rests
    on a flagged pattern of its predicted class than other classes' images rest on it, a
    quarter of it for an unconfirmed one, see ``_suspicion``; error);
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
    """Cluster the maps of ``result`` per predicted class, raise hypotheses (places, the
    context outside the box, image statistics), test each by intervention and score each
    image's suspicion (in place; returns ``result``)."""
    model.eval()
    transform = transform_for(model)
    rows = [r for r in result.rows if not r["error"]]
    maps = torch.from_numpy(result.maps)
    by_class: dict[int, list[int]] = {}
    for r in rows:
        by_class.setdefault(r["prediction"], []).append(r["index"])
    every = torch.zeros(len(result.rows), *maps.shape[-2:])
    readable = [r["index"] for r in rows]
    every[readable] = shares(maps[readable])
    for r in result.rows:
        r["cluster"], r["suspicion"] = -1, 0.0
    for c, idx in sorted(by_class.items()):
        found = cluster(maps[idx], max_clusters=max_clusters, seed=seed)
        groups = [(None, idx)]
        for k in range(found.k):
            members = [idx[j] for j in np.flatnonzero(found.labels == k)]
            for i in members:
                result.rows[i]["cluster"] = k
            result.clusters.append({"class": c, "cluster": k, "size": len(members),
                                    "mean_map": every[members].mean(0).tolist(),
                                    "members": members,
                                    "typical": _typical(maps[members], members)})
            if found.k > 1 and len(members) >= MIN_CLUSTER:
                groups.append((k, members))
        mine = set(idx)
        others = [i for i in readable if i not in mine]
        for k, members in groups:
            flag = region_flag(c, k, members, every[members], every[others])
            if flag is None:
                continue
            same = next((f for f in result.flags if f.kind == "region" and f.cls == c
                         and _overlap(f.region, flag.region) >= 0.5), None)
            if same is not None:
                same.effect.setdefault("clusters", []).append(k)
                continue
            result.flags.append(flag)
        in_box = [result.rows[i].get("in_box") for i in idx]
        if all(v is not None for v in in_box):
            flag = outside_box_flag(c, np.asarray(in_box, dtype=np.float64))
            if flag is not None:
                flag.members = list(idx)
                result.flags.append(flag)
    result.flags += _examine(model, split, transform, result, confirm_images, seed)
    _suspicion(model, split, transform, result, every)
    return result


def _overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    """Intersection over union of two bool regions."""
    return ((a & b).sum() / (a | b).sum().clamp_min(1)).item()


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


def _examine(model, split, transform, result: Audit, limit: int, seed: int) -> list[Flag]:
    """Test every hypothesis in ``result.flags`` (verdicts set in place), and test each class
    with enough images against every image statistic; returns the statistics' flags that a
    test did not refute."""
    g = np.random.default_rng(seed)
    labels = _labels(result, split)
    rows = [r for r in result.rows if not r["error"]]
    pools: dict[int, tuple[torch.Tensor, list[int], torch.Tensor]] = {}

    def pool(c: int):
        """A sample of the images predicted as ``c`` and one of the other classes' images."""
        if c not in pools:
            own = [r["index"] for r in rows if r["prediction"] == c]
            rest = [r["index"] for r in rows if r["prediction"] != c and labels[r["index"]] != c]
            own = sorted(g.permutation(own)[:limit].tolist())
            rest = g.permutation(rest)[:limit].tolist()
            pools[c] = _images(split, own, transform), own, _images(split, rest, transform)
        return pools[c]

    for f in result.flags:
        own_x, own_idx, rest_x = pool(f.cls)
        if f.kind == "outside-box":
            boxes = torch.as_tensor(np.asarray(split.boxes))
            rest_idx = [r["index"] for r in rows if r["prediction"] != f.cls
                        and labels[r["index"]] != f.cls][:limit]
            confirmed, effect = confirm_outside_box(
                model, f.cls, own_x, torch.full((len(own_idx),), f.cls), boxes[own_idx],
                _images(split, rest_idx, transform), torch.as_tensor(labels[rest_idx]),
                boxes[rest_idx])
            f.verdict, f.effect = ("finding" if confirmed else "refuted"), {**f.effect, **effect}
            continue
        at = {i: j for j, i in enumerate(own_idx)}  # the pool's images, read once
        members = [i for i in f.members if i in at]
        if members:
            x = own_x[[at[i] for i in members]]
        else:
            members = f.members[:limit]
            x = _images(split, members, transform)
        mass = (result_shares(result, members) * f.region).flatten(1).sum(1)
        top = [members[j] for j in mass.argsort(descending=True)[:DONORS].tolist()]
        f.verdict, effect = examine_region(model, f.cls, x, _images(split, top, transform),
                                           rest_x, f.region)
        f.effect = {**f.effect, **effect}
    found: list[Flag] = []
    for c in sorted({r["prediction"] for r in rows}):
        own_x, own_idx, rest_x = pool(c)
        if len(own_idx) < MIN_CLUSTER or len(rest_x) < 2:
            continue
        # a statistic is tested net of the places already found for the class: a stripe
        # also has a spectrum, and should be found once, as the place it is
        places = [f.region for f in result.flags
                  if f.kind == "region" and f.cls == c and f.confirmed]
        if places:
            px = pixel_mask(torch.stack(places).any(0), tuple(own_x.shape[-2:]))
            own_x = noisy_linear_fill(own_x, px.expand(len(own_x), 1, -1, -1))
            rest_x = noisy_linear_fill(rest_x, px.expand(len(rest_x), 1, -1, -1))
        for name in STATISTICS:
            tested = examine_statistic(model, name, c, own_x, rest_x)
            if tested is not None and tested[0] != "refuted":
                flag = statistic_flag(name, c, own_idx)
                flag.verdict, flag.effect, flag.found = tested
                found.append(flag)
    return found


def result_shares(result: Audit, indices: list[int]) -> torch.Tensor:
    """(n, gh, gw): the shares of relevance of the images ``indices``."""
    return shares(torch.from_numpy(result.maps[indices]))


WEIGHT = {"finding": 1.0, "unsettled": HYPOTHESIS_WEIGHT, "refuted": 0.0}


def _reliance(model, split, transform, result: Audit, every: torch.Tensor, f: Flag,
              indices: list[int]) -> list[float]:
    """How much each image's prediction rests on the pattern ``f``: its share of relevance on
    the region or outside the box, or the confidence its predicted class loses when the
    statistic is neutralised."""
    if f.kind == "region":
        return (every[indices] * f.region).flatten(1).sum(1).tolist()
    if f.kind == "outside-box":
        return [1 - result.rows[i]["in_box"] for i in indices]
    scores: list[float] = []
    for start in range(0, len(indices), 256):
        chunk = indices[start:start + 256]
        predicted = torch.tensor([result.rows[i]["prediction"] for i in chunk])
        scores += neutralised_drop(model, f.kind, predicted, _images(split, chunk, transform),
                                   f.found).tolist()
    return scores


def _suspicion(model, split, transform, result: Audit, every: torch.Tensor) -> None:
    """Each image's suspicion: the most, over the patterns of its predicted class, of how much
    more its prediction rests on one than the other classes' images rest on it (a region's
    share of relevance, the share outside the box, or the confidence lost when a statistic is
    neutralised, each less its mean over up to ``REFERENCE`` images of other classes), times
    the pattern's weight. Net of that baseline, reliances on patterns of different kinds and
    sizes compare: a pattern every image leans on (the context around a small object) ranks
    no image first, one only its carriers lean on ranks them first."""
    rows = [r for r in result.rows if not r["error"]]
    for f in result.flags:
        weight = WEIGHT[f.verdict or "refuted"]
        if not weight:
            continue
        own = [r["index"] for r in rows if r["prediction"] == f.cls]
        others = [r["index"] for r in rows if r["prediction"] != f.cls]
        reference = others[::max(1, -(-len(others) // REFERENCE))]  # evenly, up to REFERENCE
        baseline = (float(np.mean(_reliance(model, split, transform, result, every, f,
                                            reference))) if reference else 0.0)
        f.effect["baseline_reliance"] = baseline
        for i, score in zip(own, _reliance(model, split, transform, result, every, f, own),
                            strict=True):
            result.rows[i]["suspicion"] = max(result.rows[i]["suspicion"],
                                              weight * (score - baseline))


__all__ = ["Audit", "audit", "scan", "finish", "CORNERS", "DEFAULT_METHOD"]
