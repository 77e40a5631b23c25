"""Reading attention maps: the [CLS] row per head on the patch grid, and the readout rows of any
token-to-token matrix (rollout, gradient attribution) on the patch grid.

Grids and prefix tokens come from the :class:`~vitkit.models.vit.AttentionMaps` the model
returns (never a hard-coded 14x14); a plain list of tensors needs ``grid=`` and
``num_prefix_tokens=``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

HEAD_FUSIONS = ("mean", "max", "min")
METHODS_WITHOUT_CLS = ("rollout", "grad-rollout", "chefer", "gradcam")


@dataclass(frozen=True)
class Layout:
    """How tokens are laid out: T = num_prefix_tokens + gh*gw; ``readout`` rows feed the head
    (``(0,)`` [CLS], ``(0, 1)`` [CLS] + distillation, ``None`` average of patch tokens)."""

    grid: tuple[int, int]
    num_prefix_tokens: int
    readout: tuple[int, ...] | None

    @property
    def tokens(self) -> int:
        return self.num_prefix_tokens + self.grid[0] * self.grid[1]


def layout_of(maps: Sequence[torch.Tensor], grid=None, num_prefix_tokens: int | None = None,
              readout: tuple[int, ...] | None = (0,)) -> Layout:
    """The layout carried by ``AttentionMaps``, or given explicitly for a plain list (whose
    readout is token 0, the [CLS], unless there are no prefix tokens: then the patch mean)."""
    if grid is None and hasattr(maps, "grid"):
        layout = Layout(maps.grid, maps.num_prefix_tokens, maps.readout)
    elif grid is None or num_prefix_tokens is None:
        raise ValueError("a plain list of maps does not say its patch grid: pass grid=(gh, gw) "
                         "and num_prefix_tokens=..., or use the maps vitkit's model returns")
    else:
        gh, gw = (grid, grid) if isinstance(grid, int) else grid
        layout = Layout((gh, gw), num_prefix_tokens, readout if num_prefix_tokens else None)
    t = maps[0].shape[-1] if len(maps) else layout.tokens
    if t != layout.tokens:
        raise ValueError(f"maps have {t} tokens, but {layout.num_prefix_tokens} prefix tokens + "
                         f"a {layout.grid[0]}x{layout.grid[1]} grid make {layout.tokens}")
    return layout


def fuse_heads(attn: torch.Tensor, how: str | int) -> torch.Tensor:
    """(B, heads, ...) -> (B, ...): one head by index, or the mean / max / min over heads."""
    if isinstance(how, int):
        return attn[:, how]
    if how == "mean":
        return attn.mean(1)
    if how == "max":
        return attn.amax(1)
    if how == "min":
        return attn.amin(1)
    raise ValueError(f"head fusion must be a head index or one of {HEAD_FUSIONS}, got {how!r}")


def cls_attention(maps: Sequence[torch.Tensor], layer: int = -1, head: int | str | None = None,
                  *, grid=None, num_prefix_tokens: int | None = None) -> torch.Tensor:
    """The [CLS] token's attention over the patches, on the patch grid.

    Args:
        maps: per-layer (B, heads, T, T), as ``model(x, return_attn=True)`` returns.
        layer: which entry of ``maps``.
        head: ``None`` keeps every head, (B, heads, gh, gw); an ``int`` picks one and
            ``"mean"`` / ``"max"`` / ``"min"`` fuse them, (B, gh, gw). Averaging is never
            implicit.
    """
    layout = layout_of(maps, grid, num_prefix_tokens)
    if layout.readout is None:
        raise ValueError("this model pools by average and has no [CLS] readout, so [CLS] "
                         f"attention does not explain it; methods that apply: "
                         f"{', '.join(METHODS_WITHOUT_CLS)}")
    p = layout.num_prefix_tokens
    rows = maps[layer][:, :, 0, p:]  # (B, heads, N)
    rows = rows.reshape(*rows.shape[:2], *layout.grid)  # (B, heads, gh, gw)
    return rows if head is None else fuse_heads(rows, head)


def readout_grid(matrix: torch.Tensor, layout: Layout) -> torch.Tensor:
    """(B, T, T) token-to-token relevance -> (B, gh, gw): the rows the head reads (averaged when
    there are two, as DeiT averages its heads, or all patch rows for average pooling), over the
    patch columns."""
    p = layout.num_prefix_tokens
    rows = list(layout.readout) if layout.readout is not None else slice(p, None)
    out = matrix[:, rows, p:].mean(1)  # (B, N)
    return out.reshape(out.shape[0], *layout.grid)
