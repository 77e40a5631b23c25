"""Does a map point at the object? Localisation against known boxes: the pointing game and
the share of the map's mass in the box (faithfulness is vitkit.explain.perturb's).

Maps are (B, gh, gw) on the patch grid; boxes (B, 4) as pixel (x0, y0, x1, y1), x1/y1
exclusive.
"""

from __future__ import annotations

import torch

from vitkit.util.grids import upsample


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
