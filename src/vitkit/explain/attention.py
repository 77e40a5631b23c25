"""Reading attention maps: the [CLS] row per head on the patch grid, and the readout rows of any
token-to-token matrix (rollout, gradient attribution) on the patch grid.

Grids and prefix tokens come from the :class:`~vitkit.models.vit.AttentionMaps` the model
returns (never a hard-coded 14x14). Any other sequence of (B, heads, T, T) tensors works too (a
Hugging Face ``outputs.attentions`` tuple, a plain list): what needs no grid (rollout, any-token
rows) takes it as it is; what needs the grid is told ``grid=`` and ``num_prefix_tokens=``, or
assumes one [CLS] token and a square grid when T - 1 is a square, and logs that assumption.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from vitkit.errors import ExplainError
from vitkit.explain.registry import without_cls

HEAD_FUSIONS = ("mean", "max", "min")
log = logging.getLogger("vitkit")


@dataclass(frozen=True)
class Layout:
    """How tokens are laid out: T = num_prefix_tokens + gh*gw; ``readout`` rows feed the head
    (``(0,)`` [CLS], ``(0, 1)`` [CLS] + distillation, ``None`` every token); for attention
    pooling ``readout_weights`` (B, T) are how much each token feeds it (the MAP head's
    attention, mean over its heads), else the patch tokens feed it equally."""

    grid: tuple[int, int]
    num_prefix_tokens: int
    readout: tuple[int, ...] | None
    readout_weights: torch.Tensor | None = None

    @property
    def tokens(self) -> int:
        return self.num_prefix_tokens + self.grid[0] * self.grid[1]


def check_maps(maps: Sequence[torch.Tensor]) -> int:
    """T, after checking ``maps`` is a non-empty sequence of (B, heads, T, T) tensors."""
    if isinstance(maps, torch.Tensor) or not len(maps):
        raise ExplainError("expected a non-empty sequence of per-layer (B, heads, T, T) maps, e.g. "
                         "model(x, return_attn=True)[1] or a Hugging Face outputs.attentions; "
                         f"got {type(maps).__name__} of length {len(maps)}")
    first = maps[0]
    if first.dim() != 4 or first.shape[-1] != first.shape[-2]:
        raise ExplainError(f"each map must be (B, heads, T, T); got {tuple(first.shape)}")
    return first.shape[-1]


def layout_of(maps: Sequence[torch.Tensor], grid=None, num_prefix_tokens: int | None = None,
              readout: tuple[int, ...] | None = (0,)) -> Layout:
    """The token layout of ``maps``.

    ``AttentionMaps`` carry theirs. For any other sequence, ``grid`` and ``num_prefix_tokens``
    say it (the readout is token 0, the [CLS], unless there are no prefix tokens: then the patch
    mean); without them one [CLS] token and a square grid are assumed when T - 1 is a square,
    and the assumption is logged.
    """
    t = check_maps(maps)
    if grid is None and hasattr(maps, "grid"):
        pooled = getattr(maps, "pool_attention", None)
        layout = Layout(maps.grid, maps.num_prefix_tokens, maps.readout,
                        pooled.detach().mean(1) if pooled is not None else None)
    elif grid is None and num_prefix_tokens is None:
        side = math.isqrt(t - 1)
        if side * side != t - 1:
            raise ExplainError(
                f"these maps have T = {t} tokens, which is not 1 [CLS] + a square grid, so the "
                "patch grid cannot be inferred: pass grid=(gh, gw) and num_prefix_tokens=... "
                "(T = prefix tokens + gh*gw), or use the maps vitkit's model returns")
        log.info("maps of %d tokens read as 1 [CLS] token + a %dx%d patch grid (pass grid= and "
                 "num_prefix_tokens= if not)", t, side, side)
        layout = Layout((side, side), 1, (0,))
    else:
        if grid is None:
            n = t - num_prefix_tokens
            side = math.isqrt(max(n, 0))
            if n <= 0 or side * side != n:
                raise ExplainError(f"{t} tokens minus {num_prefix_tokens} prefix tokens is not a "
                                 "square grid; pass grid=(gh, gw)")
            grid = side
        prefix = num_prefix_tokens if num_prefix_tokens is not None else \
            t - (grid * grid if isinstance(grid, int) else grid[0] * grid[1])
        gh, gw = (grid, grid) if isinstance(grid, int) else grid
        layout = Layout((gh, gw), prefix, readout if prefix else None)
    if t != layout.tokens:
        raise ExplainError(f"maps have {t} tokens, but {layout.num_prefix_tokens} prefix tokens + "
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
    raise ExplainError(f"head fusion must be a head index or one of {HEAD_FUSIONS}, got {how!r}")


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
        raise ExplainError("this model pools by average and has no [CLS] readout, so [CLS] "
                         f"attention does not explain it; methods that apply: "
                         f"{', '.join(without_cls())}")
    p = layout.num_prefix_tokens
    rows = maps[layer][:, :, 0, p:]  # (B, heads, N)
    rows = rows.reshape(*rows.shape[:2], *layout.grid)  # (B, heads, gh, gw)
    return rows if head is None else fuse_heads(rows, head)


def token_attention(maps: Sequence[torch.Tensor], token: int, layer: int = -1,
                    head: int | str | None = None) -> torch.Tensor:
    """Where token ``token`` looks: its attention row at ``layer``, over all T tokens.

    Works on any sequence of (B, heads, T, T) maps (no grid needed). ``head=None`` keeps every
    head, (B, heads, T); an index or "mean"/"max"/"min" gives (B, T).
    """
    t = check_maps(maps)
    if not -t <= token < t:
        raise ExplainError(f"token {token} does not exist: these maps have {t} tokens")
    if not -len(maps) <= layer < len(maps):
        raise ExplainError(f"layer {layer} does not exist: {len(maps)} layers of maps were given")
    rows = maps[layer][:, :, token, :]  # (B, heads, T)
    return rows if head is None else fuse_heads(rows, head)


def readout_grid(matrix: torch.Tensor, layout: Layout) -> torch.Tensor:
    """(B, T, T) token-to-token relevance -> (B, gh, gw): the rows the head reads (averaged when
    there are two, as DeiT averages its heads; all patch rows for average pooling; every row
    weighted by the MAP head's attention for attention pooling), over the patch columns."""
    p = layout.num_prefix_tokens
    if layout.readout is None and layout.readout_weights is not None:
        out = torch.einsum("bt,btn->bn", layout.readout_weights.to(matrix.dtype), matrix[:, :, p:])
        return out.reshape(out.shape[0], *layout.grid)
    rows = list(layout.readout) if layout.readout is not None else slice(p, None)
    out = matrix[:, rows, p:].mean(1)  # (B, N)
    return out.reshape(out.shape[0], *layout.grid)


def readout_attention(maps: Sequence[torch.Tensor], *, grid=None,
                      num_prefix_tokens: int | None = None) -> torch.Tensor:
    """Where the readout looks, in every head of every layer -> (B, layers, heads, gh, gw).

    The rows the head reads (see :func:`readout_grid`): the [CLS] row ([CLS] and distillation
    rows averaged for DeiT), the mean of the patch rows for average pooling, the patch rows
    weighted by the MAP head's attention for attention pooling. Heads are never fused: this is
    the layers x heads "model view".
    """
    layout = layout_of(maps, grid, num_prefix_tokens)
    out = []
    for a in maps:
        b, h, t, _ = a.shape
        per_head = layout if layout.readout_weights is None else replace(
            layout, readout_weights=layout.readout_weights.repeat_interleave(h, 0))
        out.append(readout_grid(a.reshape(b * h, t, t), per_head).reshape(b, h, *layout.grid))
    return torch.stack(out, 1)


def pool_attention(maps, head: int | str | None = None) -> torch.Tensor:
    """The MAP head's attention over the patches, on the grid: the readout map of an
    attention-pooled model (SigLIP). ``head=None`` keeps every head, (B, heads, gh, gw);
    an index or "mean"/"max"/"min" gives (B, gh, gw)."""
    weights = getattr(maps, "pool_attention", None)
    if weights is None:
        raise ExplainError("these maps come from a model without attention pooling (no MAP "
                         "head); use cls_attention for a [CLS] model, rollout for any")
    p = maps.num_prefix_tokens
    rows = weights[:, :, p:].reshape(*weights.shape[:2], *maps.grid)
    return rows if head is None else fuse_heads(rows, head)


def register_attention(maps, layer: int = -1) -> dict[str, torch.Tensor]:
    """Register tokens kept apart from the patch grid (Darcet et al. 2023): where each register
    looks, and how much the patches look at each.

    Returns ``{"from_registers": (B, R, heads, gh, gw), "to_registers": (B, heads, R)}``, the
    second being the share of the patch rows' attention that goes to each register.
    """
    regs = getattr(maps, "num_reg_tokens", 0)
    if not hasattr(maps, "grid") or regs < 1:
        raise ExplainError("these maps have no register tokens (a model with num_reg_tokens, "
                         "e.g. vit_small_patch14_reg4_dinov2)")
    a = maps[layer]  # (B, heads, T, T)
    first = maps.num_prefix_tokens - regs  # registers come last among the prefix tokens
    p = maps.num_prefix_tokens
    rows = a[:, :, first:p, p:]  # (B, heads, R, N)
    b, h, r, _ = rows.shape
    return {"from_registers": rows.permute(0, 2, 1, 3).reshape(b, r, h, *maps.grid),
            "to_registers": a[:, :, p:, first:p].mean(2)}
