"""Weighted k-nearest-neighbour classification of frozen features, by DINOv2's protocol
(``dinov2/eval/knn.py``, after Wu et al. 2018 as DINO uses it).

Features are L2-normalised, so a dot product is the cosine similarity; each query takes its
``max(k)`` most similar training features; neighbour j votes for its label with weight
exp(sim_j / T) (T = 0.07), and the class scores for a k are the weighted one-hot votes of the
first k neighbours. DINOv2 softmaxes the top sims over the ``max(k)`` neighbours before
summing, which multiplies every query's scores by one positive number: the same ranking, and
the same scores once normalised, as here (scores sum to 1 per query and k).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from vitkit.errors import DataError

KS = (10, 20, 100, 200)
TEMPERATURE = 0.07
CHUNK = 1024  # queries compared with the training set at a time


def _normalised(x: np.ndarray, device) -> torch.Tensor:
    t = torch.as_tensor(np.ascontiguousarray(x), dtype=torch.float32, device=device)
    return torch.nn.functional.normalize(t, dim=1)


def knn_scores(train: np.ndarray, train_labels: np.ndarray, queries: np.ndarray, *,
               ks: Sequence[int] = KS, temperature: float = TEMPERATURE,
               num_classes: int | None = None,
               device: torch.device | str = "cpu") -> dict[int, np.ndarray]:
    """Train features (n, D) with labels (n,) in 0..C-1, query features (m, D) -> {k: class
    scores (m, C), each row summing to 1}, for every k in ``ks`` (each at most n)."""
    n = len(train)
    if any(k < 1 or k > n for k in ks):
        raise DataError(f"k must be 1..{n} (the training features), got {list(ks)}")
    labels = torch.as_tensor(np.asarray(train_labels), dtype=torch.long, device=device)
    classes = int(num_classes or int(labels.max()) + 1)
    bank = _normalised(train, device).T  # (D, n)
    top = max(ks)
    out: dict[int, list[np.ndarray]] = {k: [] for k in ks}
    for start in range(0, len(queries), CHUNK):
        q = _normalised(queries[start:start + CHUNK], device)
        sims, idx = (q @ bank).topk(top, dim=1, largest=True, sorted=True)  # (b, top)
        # exp(sim / T), shifted by each query's best for range: a positive factor per query
        weights = ((sims - sims[:, :1]) / temperature).exp()
        votes = torch.nn.functional.one_hot(labels[idx], classes).to(weights.dtype)
        votes = votes * weights[:, :, None]  # (b, top, C)
        for k in ks:
            s = votes[:, :k].sum(dim=1)
            out[k].append((s / s.sum(dim=1, keepdim=True)).cpu().numpy())
    return {k: np.concatenate(v) for k, v in out.items()}


def topk_hits(scores: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """(m, C) scores, (m,) labels -> (m,) bool: the label is among the ``k`` best-scored classes
    (fewer than k classes score strictly more) and scored above zero (a class no neighbour
    voted for is never a hit, whatever the order of the ties at zero)."""
    labels = np.asarray(labels)
    mine = scores[np.arange(len(labels)), labels]
    above = (scores > mine[:, None]).sum(axis=1)
    return (above < k) & (mine > 0)


def knn_eval(train: np.ndarray, train_labels: np.ndarray, val: np.ndarray,
             val_labels: np.ndarray, *, ks: Sequence[int] = KS,
             temperature: float = TEMPERATURE, num_classes: int | None = None,
             device: torch.device | str = "cpu") -> dict:
    """Top-1 and top-5 accuracy (in %) on the validation features for every k; a k above the
    training set's size is capped at it (and said in ``notes``)."""
    n = len(train)
    used = {k: min(k, n) for k in ks}
    notes = [f"k={k} capped at {n}, the number of training features" for k in ks if k > n]
    scores = knn_scores(train, train_labels, val, ks=sorted(set(used.values())),
                        temperature=temperature, num_classes=num_classes, device=device)
    per_k = []
    for k in ks:
        s = scores[used[k]]
        per_k.append({"k": k, "k_used": used[k],
                      "top1": 100.0 * float(topk_hits(s, val_labels, 1).mean()),
                      "top5": 100.0 * float(topk_hits(s, val_labels, 5).mean())})
    best = max(per_k, key=lambda r: (r["top1"], -r["k"]))
    return {"protocol": "DINOv2 weighted kNN: L2-normalised features, cosine similarity, "
                        f"weights exp(sim/T), T={temperature}",
            "temperature": temperature, "results": per_k, "best": best, "notes": notes}
