"""Perturbation curves: the one definition of deletion and insertion in vitkit.

Remove (deletion) or reveal (insertion) patches in the order a map ranks them and read the
target class's probability at each step. What the removed pixels are filled with moves the
image off the data the model saw, so the drop measures that shift as much as the map (ROAD,
Rong et al. 2022). Every caller therefore names its ``baseline``:

- ``"constant"``: zeros (the data set's mean once the image is normalised);
- ``"blur"``: a strong Gaussian blur of the image (RISE's insertion);
- ``"noisy-linear"``: ROAD's noisy linear imputation from the kept neighbours.

Maps are (B, gh, gw) on the patch grid; images (B, C, H, W) as the model takes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vitkit.errors import ExplainError

BASELINES = ("constant", "blur", "noisy-linear")
MODES = ("deletion", "insertion")
ORDERS = ("most", "least")  # most-relevant first (MoRF) or least-relevant first (LeRF)
ROAD_NOISE = 0.01  # ROAD's noise on imputed pixels (std, in the model's input units)
# ROAD's linear imputation: a removed pixel is the weighted mean of its 8 neighbours (direct
# 1/6, diagonal 1/12), i.e. the discrete Laplace equation with the kept pixels as boundary.
_NEIGHBOURS = torch.tensor([[1 / 12, 1 / 6, 1 / 12], [1 / 6, 0.0, 1 / 6],
                            [1 / 12, 1 / 6, 1 / 12]])


def auc(curve: torch.Tensor) -> torch.Tensor:
    """Area under (B, S+1) curves sampled evenly on [0, 1] (trapezoids) -> (B,)."""
    steps = curve.shape[-1] - 1
    return (curve[..., :-1] + curve[..., 1:]).sum(-1) / (2 * steps)


def random_maps(like: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """A uniformly random map of the same shape: the ordering every method must beat."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(like.shape, generator=g).to(like.device)


def step_masks(maps: torch.Tensor, steps: int, img_hw: tuple[int, int]) -> torch.Tensor:
    """(B, gh, gw) -> bool (B, S+1, H, W): step s covers the top round(s N / S) patches (ties
    in the map's order of position)."""
    b, gh, gw = maps.shape
    n = gh * gw
    order = maps.reshape(b, n).argsort(dim=-1, descending=True, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(n, device=maps.device).expand(b, n))
    counts = torch.round(torch.linspace(0, n, steps + 1, device=maps.device)).long()
    masks = ranks[:, None, :] < counts[None, :, None]  # (B, S+1, N)
    masks = masks.reshape(b, steps + 1, gh, gw)
    ph, pw = img_hw[0] // gh, img_hw[1] // gw
    return masks.repeat_interleave(ph, dim=2).repeat_interleave(pw, dim=3)


@torch.no_grad()
def class_probabilities(model, images: torch.Tensor, target: torch.Tensor,
                        batch_size: int) -> torch.Tensor:
    """(B, S+1, C, H, W) -> probability of each image's target class, (B, S+1)."""
    b, s = images.shape[:2]
    flat = images.reshape(b * s, *images.shape[2:])
    tgt = target.repeat_interleave(s)
    probs = []
    for i in range(0, len(flat), batch_size):
        p = model(flat[i:i + batch_size]).softmax(-1)
        probs.append(p.gather(1, tgt[i:i + batch_size, None])[:, 0])
    return torch.cat(probs).reshape(b, s)


def blur(images: torch.Tensor) -> torch.Tensor:
    """A strong Gaussian blur (kernel about a quarter of the image, as RISE's insertion)."""
    # torchvision comes with the train extra: only the "blur" baseline needs it
    from torchvision.transforms.v2.functional import gaussian_blur

    h, w = images.shape[-2:]
    k = max(3, (min(h, w) // 4) | 1)
    return gaussian_blur(images, [k, k], [k / 2.0, k / 2.0])


def noisy_linear_fill(images: torch.Tensor, removed: torch.Tensor, noise: float = ROAD_NOISE,
                      iterations: int | None = None, seed: int = 0) -> torch.Tensor:
    """``images`` (N, C, H, W) with the ``removed`` pixels (bool (N, 1 or C, H, W)) imputed
    from their neighbours (ROAD's linear imputation, solved by Jacobi iterations from the kept
    pixels' mean), plus Gaussian noise of std ``noise``. Where nothing is kept, zeros."""
    removed = removed.expand_as(images)
    kept = ~removed
    count = kept.flatten(2).sum(-1).clamp_min(1)[..., None, None]
    mean = (images * kept).flatten(2).sum(-1)[..., None, None] / count
    x = torch.where(removed, mean.expand_as(images), images)
    c = images.shape[1]
    kernel = _NEIGHBOURS.to(images)[None, None].expand(c, 1, 3, 3)
    steps = iterations if iterations is not None else 2 * max(images.shape[-2:])
    for _ in range(steps):
        smooth = F.conv2d(F.pad(x, (1, 1, 1, 1), mode="replicate"), kernel, groups=c)
        x = torch.where(removed, smooth, images)
    if noise > 0:
        g = torch.Generator().manual_seed(seed)
        x = x + removed * noise * torch.randn(x.shape, generator=g).to(x)
    nothing_kept = kept.flatten(1).sum(-1) == 0
    return torch.where(nothing_kept[:, None, None, None], torch.zeros_like(x), x)


def fill(images: torch.Tensor, removed: torch.Tensor, baseline: str,
         seed: int = 0) -> torch.Tensor:
    """(B, S, C, H, W) images with the ``removed`` (B, S, 1, H, W) pixels filled by
    ``baseline`` (one of BASELINES)."""
    if baseline == "constant":
        return torch.where(removed, torch.zeros_like(images), images)
    if baseline == "blur":
        blurred = blur(images[:, 0])[:, None].expand_as(images)
        return torch.where(removed, blurred, images)
    if baseline == "noisy-linear":
        b, s = images.shape[:2]
        flat = noisy_linear_fill(images.reshape(b * s, *images.shape[2:]),
                                 removed.reshape(b * s, *removed.shape[2:]), seed=seed)
        return flat.reshape(images.shape)
    raise ExplainError(f"baseline must be one of {', '.join(BASELINES)}, got {baseline!r}")


def perturbation_curves(model, images: torch.Tensor, maps: torch.Tensor, target: torch.Tensor,
                        *, mode: str, baseline: str, order: str = "most", steps: int = 16,
                        batch_size: int = 256, seed: int = 0) -> torch.Tensor:
    """The target's probability (B, S+1) as patches are removed (``mode="deletion"``) or
    revealed (``"insertion"``) in the map's order, ``steps`` steps from none to all, the
    removed pixels filled by ``baseline``.

    Deletion removes the patches from the image; insertion reveals them on an image whose
    every patch is removed. Lower deletion and higher insertion (most-relevant first) are more
    faithful; least-relevant first reverses both.
    """
    if mode not in MODES:
        raise ExplainError(f"mode must be 'deletion' or 'insertion', got {mode!r}")
    if order not in ORDERS:
        raise ExplainError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    if baseline not in BASELINES:
        raise ExplainError(f"baseline must be one of {', '.join(BASELINES)}, got {baseline!r}")
    if maps.shape[0] != images.shape[0]:
        raise ExplainError(f"{maps.shape[0]} maps for {images.shape[0]} images")
    ranked = maps if order == "most" else -maps
    chosen = step_masks(ranked, steps, tuple(images.shape[-2:]))[:, :, None]  # (B, S+1, 1, H, W)
    removed = chosen if mode == "deletion" else ~chosen
    expanded = images[:, None].expand(-1, steps + 1, -1, -1, -1)
    return class_probabilities(model, fill(expanded, removed, baseline, seed), target,
                               batch_size)


@dataclass
class Curves:
    """fractions (S+1,) of patches removed/revealed; class probability (B, S+1) for each;
    areas under them (B,). Lower deletion AUC and higher insertion AUC are more faithful."""

    fractions: torch.Tensor
    deletion: torch.Tensor
    insertion: torch.Tensor
    baseline: str

    @property
    def deletion_auc(self) -> torch.Tensor:
        return auc(self.deletion)

    @property
    def insertion_auc(self) -> torch.Tensor:
        return auc(self.insertion)


def deletion_insertion(model, images: torch.Tensor, maps: torch.Tensor, target: torch.Tensor,
                       *, baseline: str, steps: int = 16, batch_size: int = 256,
                       seed: int = 0) -> Curves:
    """Both curves of :func:`perturbation_curves`, most-relevant first, under one
    ``baseline``."""
    def curve(mode):
        return perturbation_curves(model, images, maps, target, mode=mode, baseline=baseline,
                                   steps=steps, batch_size=batch_size, seed=seed)

    return Curves(torch.linspace(0, 1, steps + 1), curve("deletion"), curve("insertion"),
                  baseline)
