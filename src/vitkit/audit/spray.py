"""Spectral Relevance Analysis (SpRAy, Lapuschkin et al. 2019): the relevance maps of one class
clustered by where they put their relevance, to find the strategies a model uses for it.

Each map is downsampled (at most 8 x 8) and scaled to shares of its positive relevance; a
symmetric k-nearest-neighbour graph of them is the affinity; the number of clusters is where the
normalised Laplacian's smallest eigenvalues show their largest gap (the eigengap); scikit-learn's
spectral clustering assigns the maps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from vitkit.audit.regions import shares

MAX_SIDE = 8  # maps are downsampled to at most this many patches a side
MAX_CLUSTERS = 8
MIN_IMAGES = 12  # fewer maps than this are one cluster


def features(maps: torch.Tensor) -> np.ndarray:
    """(n, gh, gw) -> (n, f) float64: each map downsampled and scaled to shares."""
    s = shares(maps)[:, None]
    gh, gw = s.shape[-2:]
    side = (min(gh, MAX_SIDE), min(gw, MAX_SIDE))
    return F.adaptive_avg_pool2d(s, side).flatten(1).double().numpy()


def affinity(x: np.ndarray, neighbours: int) -> np.ndarray:
    """(n, f) -> (n, n) symmetric 0/1 (and 0.5 one-sided) k-nearest-neighbour affinity."""
    from sklearn.neighbors import kneighbors_graph

    a = kneighbors_graph(x, neighbours, include_self=False).toarray()
    return (a + a.T) / 2


def eigengap(a: np.ndarray, max_clusters: int = MAX_CLUSTERS) -> tuple[int, np.ndarray]:
    """The number of clusters the affinity ``a`` (n, n) suggests and the smallest eigenvalues of
    its normalised Laplacian (ascending): the index of the largest gap among the first
    ``max_clusters + 1``."""
    from scipy.sparse.csgraph import laplacian

    lap = laplacian(a, normed=True)
    values = np.linalg.eigvalsh(lap)[:max_clusters + 1]
    gaps = np.diff(values)
    return int(np.argmax(gaps)) + 1, values


@dataclass
class Clustering:
    """``labels`` (n,) cluster of each map, ``k`` clusters, ``eigenvalues`` the Laplacian's
    smallest (empty when there were too few maps to cluster)."""

    labels: np.ndarray
    k: int
    eigenvalues: np.ndarray


def cluster(maps: torch.Tensor, max_clusters: int = MAX_CLUSTERS, seed: int = 0) -> Clustering:
    """SpRAy on the maps (n, gh, gw) of one class."""
    n = len(maps)
    if n < MIN_IMAGES:
        return Clustering(np.zeros(n, dtype=np.int64), 1, np.array([]))
    from sklearn.cluster import SpectralClustering

    x = features(maps)
    a = affinity(x, neighbours=max(5, min(n - 1, int(round(np.sqrt(n))))))
    k, values = eigengap(a, min(max_clusters, n - 1))
    if k == 1:
        return Clustering(np.zeros(n, dtype=np.int64), 1, values)
    labels = SpectralClustering(n_clusters=k, affinity="precomputed", random_state=seed,
                                assign_labels="cluster_qr").fit_predict(a)
    # number the clusters by size, largest first
    sizes = np.bincount(labels, minlength=k)
    order = np.argsort(-sizes, kind="stable")
    rename = np.empty(k, dtype=np.int64)
    rename[order] = np.arange(k)
    return Clustering(rename[labels], k, values)
