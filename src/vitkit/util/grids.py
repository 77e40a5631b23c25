"""Resampling maps on the patch grid to pixels."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def upsample(maps: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """(B, gh, gw) -> (B, H, W), bilinear (align_corners=False)."""
    return F.interpolate(maps[:, None].float(), size=size, mode="bilinear",
                         align_corners=False)[:, 0]
