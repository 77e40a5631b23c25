"""Where a map's relevance sits, per image: the border ring, each corner, the object's box, and
how spread it is.

Maps are (B, gh, gw) on the patch grid; only positive relevance (evidence for the class) counts,
each map scaled to sum to 1 (a map with no positive relevance counts as spread evenly).
"""

from __future__ import annotations

import math

import torch

from vitkit.errors import ConfigError
from vitkit.explain.localisation import mass_in_box

CORNERS = ("top_left", "top_right", "bottom_left", "bottom_right")


def shares(maps: torch.Tensor) -> torch.Tensor:
    """(B, gh, gw) -> the positive relevance of each patch as a share of the map's, (B, gh, gw)."""
    pos = maps.float().clamp_min(0).flatten(1)
    total = pos.sum(1, keepdim=True)
    even = torch.full_like(pos, 1.0 / pos.shape[1])
    return torch.where(total > 0, pos / total.clamp_min(1e-30), even).reshape(maps.shape)


def border_mask(grid: tuple[int, int]) -> torch.Tensor:
    """bool (gh, gw): the outermost ring of patches."""
    m = torch.zeros(grid, dtype=torch.bool)
    m[0], m[-1], m[:, 0], m[:, -1] = True, True, True, True
    return m


def corner_masks(grid: tuple[int, int]) -> dict[str, torch.Tensor]:
    """bool (gh, gw) per corner: a square of a quarter of the grid's shorter side (at least
    one patch)."""
    gh, gw = grid
    k = max(1, min(gh, gw) // 4)
    out = {}
    for name, rows, cols in (("top_left", slice(0, k), slice(0, k)),
                             ("top_right", slice(0, k), slice(gw - k, gw)),
                             ("bottom_left", slice(gh - k, gh), slice(0, k)),
                             ("bottom_right", slice(gh - k, gh), slice(gw - k, gw))):
        m = torch.zeros(grid, dtype=torch.bool)
        m[rows, cols] = True
        out[name] = m
    return out


def entropy(maps: torch.Tensor) -> torch.Tensor:
    """(B, gh, gw) -> the entropy of each map's shares over its patches, scaled to [0, 1]
    (1: spread evenly; 0: on one patch), (B,)."""
    p = shares(maps).flatten(1)
    h = -(p * p.clamp_min(1e-30).log()).sum(1)
    return h / math.log(p.shape[1]) if p.shape[1] > 1 else torch.zeros_like(h)


def image_stats(maps: torch.Tensor, boxes: torch.Tensor | None = None,
                img_size: tuple[int, int] | None = None) -> dict[str, torch.Tensor]:
    """Per image (B,): the share of relevance on the border ring and in each corner, the map's
    entropy, and with ``boxes`` (B, 4) pixel boxes on images of ``img_size`` the share inside
    the box."""
    s = shares(maps)
    grid = tuple(maps.shape[-2:])
    out = {"border": (s * border_mask(grid)).flatten(1).sum(1)}
    for name, m in corner_masks(grid).items():
        out[name] = (s * m).flatten(1).sum(1)
    out["entropy"] = entropy(maps)
    if boxes is not None:
        if img_size is None:
            raise ConfigError("the share inside the box needs the image size")
        out["in_box"] = mass_in_box(maps, boxes, img_size)
    return out
