"""The attribution methods vitkit ships, each registered in :data:`METHODS`
(:mod:`vitkit.explain.registry`). Adding a method is a function (in its own module) plus one
``register(...)`` line below.
"""

from __future__ import annotations

import torch

from vitkit.explain.attention import cls_attention, layout_of, pool_attention, readout_grid
from vitkit.explain.gradients import (
    attention_gradients,
    chefer,
    grad_rollout,
    targets,
    token_gradcam,
)
from vitkit.explain.lrp import relevance, to_patches
from vitkit.explain.registry import (  # noqa: F401  (the registry's names, where users look)
    METHODS,
    Explanation,
    Method,
    applicable,
    explain_map,
    register,
    without_cls,
)
from vitkit.explain.rollout import attention_rollout


def _forward(model, x, outputs):
    if outputs is None:
        with torch.no_grad():
            outputs = model(x, return_attn=True)
    return outputs


def _cls(model, x, target, o, outputs):
    logits, maps = _forward(model, x, outputs)
    return cls_attention(maps, layer=o["layer"], head=o["head"]), logits, logits.argmax(-1)


def _map(model, x, target, o, outputs):
    logits, maps = _forward(model, x, outputs)
    return pool_attention(maps, head=o["head"]), logits, logits.argmax(-1)


def _rollout(model, x, target, o, outputs):
    logits, maps = _forward(model, x, outputs)
    matrix = attention_rollout(maps, o["residual"], o["head_fusion"], o["discard_ratio"])
    return readout_grid(matrix, layout_of(maps)), logits, logits.argmax(-1)


def _grad_rollout(model, x, target, o, outputs):
    attr = attention_gradients(model, x, target)
    matrix = grad_rollout(attr, o["residual"], o["discard_ratio"])
    return readout_grid(matrix, attr.layout), attr.logits, attr.target


def _chefer(model, x, target, o, outputs):
    attr = attention_gradients(model, x, target)
    return readout_grid(chefer(attr), attr.layout), attr.logits, attr.target


def _lrp(rule: str):
    def compute(model, x, target, o, outputs):
        pixels, logits, chosen, error, *budget = relevance(model, x, target, rule,
                                                           o.get("budget", False))
        return (to_patches(pixels, model.cfg.patch_size), logits, chosen, error,
                budget[0] if budget else None)
    return compute


def _gradcam(model, x, target, o, outputs):
    cam, logits = token_gradcam(model, x, target)
    return cam, logits, targets(logits, target)


register(Method("cls", "[CLS] attention of one layer, per head or fused by name",
                ("layer", "head"), needs_cls=True, gradients=False, compute=_cls))
register(Method("map", "the MAP head's attention over the patches (SigLIP's readout)",
                ("head",), needs_cls=False, gradients=False, compute=_map, needs_map=True))
register(Method("rollout", "attention rollout over all layers (Abnar & Zuidema 2020)",
                ("residual", "head_fusion", "discard_ratio"), needs_cls=False, gradients=False,
                compute=_rollout))
register(Method("grad-rollout", "rollout of gradient-weighted attention",
                ("residual", "discard_ratio"), needs_cls=False, gradients=True,
                compute=_grad_rollout))
register(Method("chefer", "Chefer et al. 2021 relevance (gradient x attention)", (),
                needs_cls=False, gradients=True, compute=_chefer))
register(Method("gradcam", "Grad-CAM on the tokens entering the last block", (),
                needs_cls=False, gradients=True, compute=_gradcam))
register(Method("attnlrp", "AttnLRP (Achtibat et al. 2024): relevance conserved through "
                "attention, one backward pass", (), needs_cls=False, gradients=True,
                compute=_lrp("attnlrp")))
register(Method("cp-lrp", "CP-LRP (Ali et al. 2022): LRP with the attention weights held "
                "constant", (), needs_cls=False, gradients=True, compute=_lrp("cp-lrp")))
