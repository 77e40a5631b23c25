"""Position-table resizing: move a learned 1-D position table to a new patch grid.

A ViT's position table has one row per prefix token ([CLS], distillation, registers) followed by
one row per patch, laid out row-major over the (gh, gw) patch grid. Moving a model to a new
resolution keeps the prefix rows as they are and resizes the patch rows as a 2-D image.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vitkit.errors import ModelError
from vitkit.models.config import Pair, as_pair  # noqa: F401  (re-exported: Pair, as_pair)


def interpolate_pos_embed(
    pos_embed: torch.Tensor,
    old_grid: Pair,
    new_grid: Pair,
    num_prefix_tokens: int = 1,
    mode: str = "bicubic",
    antialias: bool = False,
    always: bool = False,
) -> torch.Tensor:
    """Resize a position table from ``old_grid`` to ``new_grid``.

    Args:
        pos_embed: (1, num_prefix_tokens + gh*gw, D) or (num_prefix_tokens + gh*gw, D).
        old_grid: the grid the patch rows are laid out on, ``int`` or ``(gh, gw)``.
        new_grid: the target grid, ``int`` or ``(gh', gw')``; rectangles are fine.
        num_prefix_tokens: leading rows kept unchanged ([CLS], distillation, registers).
        mode: ``torch.nn.functional.interpolate`` mode; bicubic with ``align_corners=False``
            by default, as timm and big_vision do.
        antialias: off by default (big_vision, and timm with ``antialias=False``). timm's own
            default is on, which for bicubic also changes the kernel when upsampling (PIL's
            a=-0.5 instead of a=-0.75); pass ``True`` to reproduce timm's default exactly.
        always: resize even when the grids are equal (bicubic to the same grid is the
            identity up to rounding), for traced graphs whose grid is symbolic (ONNX export).

    Returns:
        The table with ``num_prefix_tokens + gh'*gw'`` rows, same leading shape and dtype.
        When the grids are equal the input is returned unchanged (exact identity).
    """
    old_h, old_w = as_pair(old_grid)
    # a traced grid stays symbolic (as_pair's int() would fix it to the example's)
    new_h, new_w = new_grid if always and isinstance(new_grid, tuple) else as_pair(new_grid)
    squeeze = pos_embed.dim() == 2
    table = pos_embed.unsqueeze(0) if squeeze else pos_embed
    if table.dim() != 3 or table.shape[0] != 1:
        raise ModelError(
            f"pos_embed must be (1, T, D) or (T, D); got shape {tuple(pos_embed.shape)}"
        )
    expected = num_prefix_tokens + old_h * old_w
    if table.shape[1] != expected:
        raise ModelError(
            f"pos_embed has {table.shape[1]} rows but {num_prefix_tokens} prefix tokens + an "
            f"{old_h}x{old_w} grid need {expected}; check old_grid and num_prefix_tokens"
        )
    if not always and (old_h, old_w) == (new_h, new_w):
        return pos_embed

    prefix, patches = table[:, :num_prefix_tokens], table[:, num_prefix_tokens:]
    dim = table.shape[-1]
    # (1, gh*gw, D) -> (1, D, gh, gw): interpolate in float32 for half-precision tables.
    grid = patches.reshape(1, old_h, old_w, dim).permute(0, 3, 1, 2).float()
    grid = F.interpolate(
        grid, size=(new_h, new_w), mode=mode, align_corners=False, antialias=antialias
    )
    patches = grid.permute(0, 2, 3, 1).reshape(1, new_h * new_w, dim).to(table.dtype)
    out = torch.cat([prefix, patches], dim=1)  # (1, P + gh'*gw', D)
    return out.squeeze(0) if squeeze else out
