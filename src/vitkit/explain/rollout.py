"""Attention rollout (Abnar & Zuidema 2020), batched and with the known bugs avoided.

Per layer: fuse the heads, optionally zero the weakest entries, mix with the identity for the
residual path, renormalise each row (keepdim), and multiply: R <- A_l R. The result (B, T, T)
says how much each input token flows into each output token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vitkit.errors import ExplainError
from vitkit.explain.attention import check_maps, fuse_heads


def _check_consecutive(maps) -> None:
    layers = getattr(maps, "layers", None)
    if layers is not None and layers != list(range(layers[0], layers[0] + len(layers))):
        raise ExplainError(f"rollout multiplies consecutive layers, but these maps are of layers "
                         f"{layers}; call model(x, return_attn=True) without attn_layers")


def discard_lowest(fused: torch.Tensor, ratio: float, protect_cls: bool) -> torch.Tensor:
    """Zero the lowest ``ratio`` of each image's (T, T) entries; with ``protect_cls`` the
    [CLS] row and column (token 0) are never discarded. (B, T, T) -> (B, T, T), a copy."""
    if ratio <= 0:
        return fused
    if not 0 <= ratio < 1:
        raise ExplainError(f"discard_ratio must be in [0, 1), got {ratio}")
    b, t, _ = fused.shape
    keyed = fused.clone()
    if protect_cls:
        keyed[:, 0, :] = float("inf")
        keyed[:, :, 0] = float("inf")
    candidates = t * t - (2 * t - 1 if protect_cls else 0)
    k = int(candidates * ratio)
    if k == 0:
        return fused
    idx = keyed.reshape(b, -1).topk(k, dim=-1, largest=False).indices  # (B, k)
    out = fused.reshape(b, -1).clone()
    out.scatter_(1, idx, 0.0)  # every image in the batch, not only the first
    return out.reshape(b, t, t)


def rollout_fused(fused: Sequence[torch.Tensor], residual: float = 0.5,
                  discard_ratio: float = 0.0, protect_cls: bool = True) -> torch.Tensor:
    """Roll out already head-fused (B, T, T) matrices, first layer first -> (B, T, T)."""
    if not 0 <= residual <= 1:
        raise ExplainError(f"residual must be in [0, 1], got {residual}")
    first = fused[0]
    eye = torch.eye(first.shape[-1], dtype=first.dtype, device=first.device)
    result = eye.expand_as(first).clone()
    for a in fused:
        a = discard_lowest(a, discard_ratio, protect_cls)
        a = (1 - residual) * a + residual * eye
        a = a / a.sum(dim=-1, keepdim=True).clamp_min(1e-12)  # rows, keepdim: never columns
        result = a @ result
    return result


def attention_rollout(maps: Sequence[torch.Tensor], residual: float = 0.5,
                      head_fusion: str = "mean", discard_ratio: float = 0.0,
                      start_layer: int = 0, *,
                      num_prefix_tokens: int | None = None) -> torch.Tensor:
    """Rollout of per-layer maps (B, heads, T, T) from ``start_layer`` on -> (B, T, T).

    ``maps`` is any sequence of consecutive layers' maps, first layer first: what
    ``model(x, return_attn=True)`` returns, a Hugging Face ``outputs.attentions`` tuple, a list.
    No grid is needed. ``head_fusion`` is "mean", "max" or "min"; ``discard_ratio`` zeroes
    that share of the weakest fused entries per image and layer, never the row or column of
    token 0 when it is a [CLS] token (assumed for maps that do not say their layout, unless
    ``num_prefix_tokens=0``);
    ``residual`` is the weight of the identity (0.5: A' = (A + I) / 2, then rows renormalised).
    Use :func:`~vitkit.explain.attention.readout_grid` for the map on the patch grid.
    """
    check_maps(maps)
    _check_consecutive(maps)
    if not 0 <= start_layer < len(maps):
        raise ExplainError(f"start_layer {start_layer} is outside the {len(maps)} layers given")
    fused = [fuse_heads(a, head_fusion) for a in list(maps)[start_layer:]]
    if num_prefix_tokens is not None:
        protect_cls = num_prefix_tokens > 0
    else:
        protect_cls = getattr(maps, "readout", (0,)) is not None
    return rollout_fused(fused, residual, discard_ratio, protect_cls=protect_cls)
