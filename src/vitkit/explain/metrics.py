"""How far can a map be trusted? Faithfulness (deletion / insertion) and localisation
(pointing game, mass in box), with a random map as the floor.

Maps are (B, gh, gw) on the patch grid; images (B, C, H, W) as the model takes them; boxes
(B, 4) as pixel (x0, y0, x1, y1), x1/y1 exclusive.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchvision.transforms.v2.functional import gaussian_blur

from vitkit.errors import ExplainError
from vitkit.util.grids import upsample


def random_maps(like: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """A uniformly random map of the same shape: the ordering every method must beat."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(like.shape, generator=g).to(like.device)


def auc(curve: torch.Tensor) -> torch.Tensor:
    """Area under (B, S+1) curves sampled evenly on [0, 1] (trapezoids) -> (B,)."""
    steps = curve.shape[-1] - 1
    return (curve[..., :-1] + curve[..., 1:]).sum(-1) / (2 * steps)


@dataclass
class Curves:
    """fractions (S+1,) of patches removed/revealed; class probability (B, S+1) for each;
    areas under them (B,). Lower deletion AUC and higher insertion AUC are more faithful."""

    fractions: torch.Tensor
    deletion: torch.Tensor
    insertion: torch.Tensor

    @property
    def deletion_auc(self) -> torch.Tensor:
        return auc(self.deletion)

    @property
    def insertion_auc(self) -> torch.Tensor:
        return auc(self.insertion)


def step_masks(maps: torch.Tensor, steps: int, img_hw: tuple[int, int]) -> torch.Tensor:
    """(B, gh, gw) -> bool (B, S+1, H, W): step s covers the top round(s N / S) patches."""
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


def deletion_insertion(model, images: torch.Tensor, maps: torch.Tensor, target: torch.Tensor,
                       steps: int = 16, batch_size: int = 256,
                       deletion_baseline: torch.Tensor | None = None,
                       insertion_baseline: torch.Tensor | None = None) -> Curves:
    """Remove (deletion) or reveal (insertion) patches in order of the map's score.

    Deletion replaces removed patches with ``deletion_baseline`` (zeros: the mean image after
    normalisation); insertion starts from ``insertion_baseline`` (a strong Gaussian blur of the
    image, as in RISE) and pastes the original patches back.
    """
    if maps.shape[0] != images.shape[0]:
        raise ExplainError(f"{maps.shape[0]} maps for {images.shape[0]} images")
    h, w = images.shape[-2:]
    masks = step_masks(maps, steps, (h, w))[:, :, None]  # (B, S+1, 1, H, W)
    if deletion_baseline is None:
        deletion_baseline = torch.zeros_like(images)
    if insertion_baseline is None:
        k = max(3, (min(h, w) // 4) | 1)  # odd kernel about a quarter of the image
        insertion_baseline = gaussian_blur(images, [k, k], [k / 2.0, k / 2.0])
    img = images[:, None]
    deleted = torch.where(masks, deletion_baseline[:, None], img)
    inserted = torch.where(masks, img, insertion_baseline[:, None])
    return Curves(
        fractions=torch.linspace(0, 1, steps + 1),
        deletion=class_probabilities(model, deleted, target, batch_size),
        insertion=class_probabilities(model, inserted, target, batch_size),
    )


def box_masks(boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(B, 4) pixel boxes -> bool (B, H, W)."""
    h, w = size
    ys = torch.arange(h, device=boxes.device)[None, :, None]
    xs = torch.arange(w, device=boxes.device)[None, None, :]
    x0, y0, x1, y1 = (boxes[:, i, None, None] for i in range(4))
    return (xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1)


def pointing_game(maps: torch.Tensor, boxes: torch.Tensor,
                  size: tuple[int, int]) -> torch.Tensor:
    """Whether each map's maximum, upsampled to ``size`` (H, W), falls inside its box. (B,)"""
    up = upsample(maps, size)
    b = up.shape[0]
    idx = up.reshape(b, -1).argmax(-1)
    inside = box_masks(boxes, size).reshape(b, -1)
    return inside.gather(1, idx[:, None])[:, 0]


def mass_in_box(maps: torch.Tensor, boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Share of each map's (positive) mass, upsampled to ``size``, inside its box. (B,)"""
    up = upsample(maps, size).clamp_min(0)
    inside = (up * box_masks(boxes, size)).flatten(1).sum(-1)
    return inside / up.flatten(1).sum(-1).clamp_min(1e-12)
