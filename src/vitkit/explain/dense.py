"""A backbone's dense features: the patch tokens, as people look at them.

- :func:`patch_features`: the patch tokens (B, gh, gw, D) and the prefix tokens (B, P, D) of
  ``model.forward_features`` (after the final norm).
- :func:`feature_pca`: the patch features as RGB, as in the DINOv2 figures (Oquab et al. 2023,
  Fig. 1; facebookresearch/dinov2 issues 23 and 412): a PCA of every patch, its first component
  thresholded to split foreground from background, then a PCA of the foreground patches alone
  whose first three components, each min-max scaled, are red, green and blue (background black).
  One image, or several on one shared basis.
- :func:`patch_similarity`: the cosine of one patch with every patch, in its own image or in
  another; :func:`best_matches`: for each patch of image A, its most similar patch in image B.
- :func:`artifact_patches` / :func:`artifact_mask`: the high-norm artifact tokens (Darcet et al.
  2023) among the patches, found by :func:`vitkit.explain.stats.outlier_tokens` on the last
  block's output norms (:func:`vitkit.explain.stats.token_norms`), as the doctor and the
  explorer find them.

The PCA is scikit-learn's (``PCA(svd_solver="full")``: exact and deterministic), imported when
first used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from vitkit.errors import ExplainError, VitkitError
from vitkit.explain import stats
from vitkit.models.cnn import is_cnn
from vitkit.models.config import patch_grid

THRESHOLD = 0.5  # foreground: the min-max scaled first component above this
NEEDS_SKLEARN = ("the PCA picture needs scikit-learn: pip install scikit-learn (it comes with "
                 "vitkit[train])")


def _check_vit(model) -> None:
    if is_cnn(model):
        raise ExplainError(f"dense features are a ViT's patch tokens; this checkpoint is a CNN "
                           f"({model.cfg.arch}): give a ViT checkpoint")


@torch.no_grad()
def patch_features(model, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Images x (B, C, H, W) -> (patch tokens (B, gh, gw, D), prefix tokens (B, P, D)): the
    output of ``model.forward_features(x)`` after the final norm, its first
    ``model.num_prefix_tokens`` rows ([CLS], distillation, registers) apart, the rest laid out
    on the patch grid row by row."""
    _check_vit(model)
    tokens = model.forward_features(x)  # (B, T, D)
    grid = patch_grid(tuple(x.shape[-2:]), model.cfg.patch_size)
    p = model.num_prefix_tokens
    b, _, d = tokens.shape
    return tokens[:, p:].reshape(b, *grid, d), tokens[:, :p]


@dataclass(frozen=True)
class FeaturePCA:
    """What :func:`feature_pca` found, for B images on a (gh, gw) grid.

    ``rgb`` (B, gh, gw, 3) float32 in [0, 1] (background 0); ``foreground`` (B, gh, gw) bool;
    ``first`` (B, gh, gw): the first component of the PCA of every patch, min-max scaled to
    [0, 1] with the sign chosen so that the image border is mostly background; ``explained``
    (B, 3): the explained-variance ratio of the foreground PCA's three components (the same row
    for every image on a shared basis; 0 for a component the foreground cannot hold);
    ``first_explained`` (B,): that of the first component over every patch; ``threshold``
    (None: no split, every patch foreground); ``shared``: one basis for every image."""

    rgb: np.ndarray
    foreground: np.ndarray
    first: np.ndarray
    explained: np.ndarray
    first_explained: np.ndarray
    threshold: float | None
    shared: bool


def _pca(n_components: int):
    try:
        from sklearn.decomposition import PCA
    except ImportError:  # pragma: no cover - the train and dev extras install it
        raise VitkitError(NEEDS_SKLEARN) from None
    return PCA(n_components=n_components, svd_solver="full")


def _scaled(v: np.ndarray) -> np.ndarray:
    """Min-max scaled to [0, 1] along the first axis (a constant column becomes zeros)."""
    lo, hi = v.min(axis=0), v.max(axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)
    return np.where(hi > lo, (v - lo) / span, 0.0)


def border_mask(grid: tuple[int, int]) -> np.ndarray:
    """(gh, gw) bool: the patches on the image's edge (first and last rows and columns)."""
    m = np.zeros(grid, dtype=bool)
    m[[0, -1], :] = True
    m[:, [0, -1]] = True
    return m


def _fit(x: np.ndarray, border: np.ndarray, threshold: float | None):
    """Patches x (n, D), which of them are on a border (n,) -> (rgb (n, 3), foreground (n,),
    first (n,), explained (3,), first_explained)."""
    n, d = x.shape
    first, first_ratio = np.zeros(n), 0.0
    if n >= 2:
        pca = _pca(1).fit(x)
        first = _scaled(pca.transform(x)[:, 0])
        first_ratio = float(pca.explained_variance_ratio_[0])
        # the sign: the one that puts fewer border patches in the foreground (ties: the one
        # whose border patches score lower), so the object, not the frame, is foreground
        cut = THRESHOLD if threshold is None else threshold
        kept, flipped = (first[border] > cut).sum(), ((1 - first[border]) > cut).sum()
        if flipped < kept or (flipped == kept and first[border].mean() > 0.5):
            first = 1 - first
    fg = np.ones(n, dtype=bool) if threshold is None else first > threshold
    rgb, explained = np.zeros((n, 3)), np.zeros(3)
    m = int(fg.sum())
    k = min(3, m, d) if m >= 2 else 0
    if k:
        pca = _pca(k).fit(x[fg])
        rgb[fg, :k] = _scaled(pca.transform(x[fg]))
        explained[:k] = pca.explained_variance_ratio_
    elif m:  # one foreground patch: nothing to spread over colours
        rgb[fg] = 1.0
    return rgb, fg, first, explained, first_ratio


def feature_pca(features, *, threshold: float | None = THRESHOLD,
                shared: bool = True) -> FeaturePCA:
    """Patch features (B, gh, gw, D) (a tensor or an array) -> :class:`FeaturePCA`.

    1. A PCA of every patch (of every image, on a shared basis; of each image alone
       otherwise); its first component, min-max scaled to [0, 1], is flipped if need be so
       that fewer of the border patches exceed ``threshold`` (ties: so that the border scores
       lower on average): the convention that objects sit inside the frame. Patches above
       ``threshold`` are foreground (``threshold=None``: every patch is).
    2. A PCA of the foreground patches alone; each of its first three components, min-max
       scaled over those patches, is one of red, green and blue. Background patches are black.

    ``shared=True`` fits both PCAs on the patches of every image together (the same colour
    means the same direction in feature space in every image, as in DINOv2's figures of
    several images); ``shared=False`` fits each image alone.
    """
    f = features.detach().cpu().numpy() if isinstance(features, torch.Tensor) else \
        np.asarray(features)
    if f.ndim != 4:
        raise ExplainError(f"features must be (B, gh, gw, D), got shape {tuple(f.shape)}")
    if threshold is not None and not 0 <= threshold < 1:
        raise ExplainError(f"threshold must be in [0, 1) (the share of the first component's "
                           f"range), or None for no foreground split; got {threshold}")
    b, gh, gw, d = f.shape
    x = f.reshape(b, gh * gw, d).astype(np.float64)
    border = np.broadcast_to(border_mask((gh, gw)).ravel(), (b, gh * gw))
    groups = [np.arange(b)] if shared else [np.array([i]) for i in range(b)]
    rgb, fg, first = np.zeros((b, gh * gw, 3)), np.zeros((b, gh * gw), bool), np.zeros((b, gh * gw))
    explained, first_explained = np.zeros((b, 3)), np.zeros(b)
    for idx in groups:
        r, g, s, e, e1 = _fit(x[idx].reshape(-1, d), border[idx].ravel(), threshold)
        rgb[idx], fg[idx], first[idx] = (r.reshape(len(idx), -1, 3), g.reshape(len(idx), -1),
                                         s.reshape(len(idx), -1))
        explained[idx], first_explained[idx] = e, e1
    return FeaturePCA(rgb.reshape(b, gh, gw, 3).astype(np.float32), fg.reshape(b, gh, gw),
                      first.reshape(b, gh, gw).astype(np.float32), explained.astype(np.float32),
                      first_explained.astype(np.float32), threshold, shared)


def check_patch(row: int, col: int, grid: tuple[int, int]) -> None:
    """Refuse a patch outside the (gh, gw) grid, naming the grid."""
    gh, gw = grid
    if not (0 <= row < gh and 0 <= col < gw):
        raise ExplainError(f"patch (row {row}, column {col}) is outside the {gh}x{gw} patch "
                           f"grid: rows 0..{gh - 1}, columns 0..{gw - 1}")


def patch_similarity(features: torch.Tensor, row: int, col: int, *,
                     other: torch.Tensor | None = None) -> torch.Tensor:
    """The cosine similarity of patch (``row``, ``col``) of each image of ``features``
    (B, gh, gw, D) with every patch of the same image -> (B, gh, gw); with ``other``
    (B, gh', gw', D), or (1, gh', gw', D) for one image for all) with every patch of ``other``'s
    image -> (B, gh', gw'). The patch itself scores 1."""
    if features.dim() != 4:
        raise ExplainError(f"features must be (B, gh, gw, D), got shape {tuple(features.shape)}")
    check_patch(row, col, tuple(features.shape[1:3]))
    target = features if other is None else other
    q = F.normalize(features[:, row, col].float(), dim=-1)  # (B, D)
    t = F.normalize(target.float(), dim=-1)  # (B', gh', gw', D)
    return torch.einsum("bd,bhwd->bhw", q, t.expand(len(q), *t.shape[1:]))


@dataclass(frozen=True)
class Matches:
    """For each patch of image A (gh, gw): ``index`` (gh, gw, 2) the (row, col) of its most
    similar patch in image B; ``similarity`` (gh, gw) that cosine; ``mutual`` (gh, gw) bool:
    A's patch is also the best match of that patch of B (a mutual nearest neighbour)."""

    index: torch.Tensor
    similarity: torch.Tensor
    mutual: torch.Tensor


def best_matches(a: torch.Tensor, b: torch.Tensor) -> Matches:
    """Patch features of image A (gh, gw, D) and image B (gh', gw', D) -> :class:`Matches`:
    dense correspondence by cosine similarity."""
    if a.dim() != 3 or b.dim() != 3 or a.shape[-1] != b.shape[-1]:
        raise ExplainError(f"best_matches takes two images' features (gh, gw, D) of one width; "
                           f"got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    gh, gw, d = a.shape
    gw_b = b.shape[1]
    sim = F.normalize(a.reshape(-1, d).float(), dim=-1) @ \
        F.normalize(b.reshape(-1, d).float(), dim=-1).T  # (N_a, N_b)
    score, j = sim.max(dim=1)
    back = sim.argmax(dim=0)  # B's patches' best match in A
    mutual = back[j] == torch.arange(len(j))
    index = torch.stack([j // gw_b, j % gw_b], -1)
    return Matches(index.reshape(gh, gw, 2), score.reshape(gh, gw), mutual.reshape(gh, gw))


def artifact_patches(norms: torch.Tensor, num_prefix_tokens: int, grid: tuple[int, int], *,
                     k: float = 8.0) -> torch.Tensor:
    """Token norms (B, T) of one layer (the last block's output, as Darcet et al. measure)
    -> (B, gh, gw) bool: the patches whose norm exceeds the median + ``k`` MAD of that image's
    patch norms (:func:`vitkit.explain.stats.outlier_tokens`; the prefix tokens are not
    counted)."""
    patches = norms[:, num_prefix_tokens:]
    if patches.shape[1] != grid[0] * grid[1]:
        raise ExplainError(f"norms of {norms.shape[1]} tokens do not hold {num_prefix_tokens} "
                           f"prefix tokens and a {grid[0]}x{grid[1]} grid")
    mask = torch.zeros(patches.shape, dtype=torch.bool)
    for i, row in enumerate(patches):
        mask[i, stats.outlier_tokens(row.float().cpu(), k)] = True
    return mask.reshape(len(norms), *grid)


def artifact_mask(model, x: torch.Tensor, k: float = 8.0) -> torch.Tensor:
    """Images x (B, C, H, W) -> (B, gh, gw) bool: the high-norm artifact patches of the last
    block's output (:func:`artifact_patches` of :func:`vitkit.explain.stats.token_norms`)."""
    _check_vit(model)
    norms = stats.token_norms(model, x)[-1]  # (B, T)
    return artifact_patches(norms, model.num_prefix_tokens,
                            patch_grid(tuple(x.shape[-2:]), model.cfg.patch_size), k=k)
