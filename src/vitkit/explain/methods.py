"""One entry point for every attribution method: ``explain_map(model, x, method)``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vitkit.explain.attention import cls_attention, layout_of, readout_grid
from vitkit.explain.gradients import (
    attention_gradients,
    chefer,
    grad_rollout,
    targets,
    token_gradcam,
)
from vitkit.explain.rollout import attention_rollout

METHODS = ("cls", "rollout", "grad-rollout", "chefer", "gradcam")


@dataclass
class Explanation:
    """A method's map on the patch grid (B, gh, gw), with the logits (B, C) and the class
    (B,) it explains (the prediction unless a target was given)."""

    method: str
    map: torch.Tensor
    logits: torch.Tensor
    target: torch.Tensor


def explain_map(model, x: torch.Tensor, method: str = "rollout", target=None, *,
                layer: int = -1, head: int | str = "mean", residual: float = 0.5,
                discard_ratio: float = 0.0, head_fusion: str = "mean",
                outputs: tuple[torch.Tensor, list] | None = None) -> Explanation:
    """The (B, gh, gw) relevance of each patch under ``method`` for ``target``.

    ``cls``: [CLS] attention of ``layer`` with ``head`` an index or an explicit fusion;
    ``rollout``: attention rollout (``residual``, ``head_fusion``, ``discard_ratio``);
    ``grad-rollout``: gradient-weighted rollout; ``chefer``: Chefer et al. 2021;
    ``gradcam``: Grad-CAM on the last block's input tokens. Attention-only methods explain the
    predicted class whatever ``target`` is. ``outputs``: the (logits, maps) that
    ``model(x, return_attn=True)`` already gave for this ``x``; ``cls`` and ``rollout`` then
    reuse them instead of running the model again.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if method == "gradcam":
        cam, logits = token_gradcam(model, x, target)
        return Explanation(method, cam, logits, targets(logits, target))
    if method in ("grad-rollout", "chefer"):
        attr = attention_gradients(model, x, target)
        matrix = grad_rollout(attr, residual, discard_ratio) if method == "grad-rollout" \
            else chefer(attr)
        return Explanation(method, readout_grid(matrix, attr.layout), attr.logits, attr.target)
    if outputs is None:
        with torch.no_grad():
            outputs = model(x, return_attn=True)
    logits, maps = outputs
    if method == "cls":
        grid_map = cls_attention(maps, layer=layer, head=head)
    else:
        matrix = attention_rollout(maps, residual, head_fusion, discard_ratio)
        grid_map = readout_grid(matrix, layout_of(maps))
    return Explanation(method, grid_map, logits, logits.argmax(-1))
