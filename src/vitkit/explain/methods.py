"""The registry of attribution methods, and one entry point for all: ``explain_map``.

A method is a :class:`Method`: its name, a one-line summary, the ``explain_map`` options it
reads, whether it needs a [CLS] readout, whether it runs a backward pass, and a function
``(model, x, target, options, outputs) -> (map (B, gh, gw), logits (B, C), target (B,))``.
Adding a method is a function (in its own module) plus one ``register(...)`` line below; the
CLI's ``--method`` choices, the error texts and any list shown to users come from ``METHODS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vitkit.explain.attention import cls_attention, layout_of, pool_attention, readout_grid
from vitkit.explain.gradients import (
    attention_gradients,
    chefer,
    grad_rollout,
    targets,
    token_gradcam,
)
from vitkit.explain.rollout import attention_rollout


@dataclass(frozen=True)
class Method:
    """One attribution method, as the registry knows it."""

    name: str
    summary: str
    options: tuple[str, ...]  # the explain_map keywords it reads
    needs_cls: bool  # explains a [CLS] readout only (refused for average or attention pooling)
    gradients: bool  # runs a backward pass (explains ``target``, not only the prediction)
    compute: Callable
    needs_map: bool = False  # explains attention pooling (a MAP head) only


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add ``method`` to :data:`METHODS` under its name."""
    if method.name in METHODS:
        raise ValueError(f"an attribution method called {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def without_cls() -> list[str]:
    """Methods that apply to models without a [CLS] readout (average pooling)."""
    return [m.name for m in METHODS.values() if not m.needs_cls and not m.needs_map]


def applicable(cfg) -> list[str]:
    """The methods that explain a model with config ``cfg``."""
    has_cls = getattr(cfg, "readout_rows", None) is not None
    has_map = getattr(cfg, "pool", None) == "map"
    return [m.name for m in METHODS.values()
            if (has_cls or not m.needs_cls) and (has_map or not m.needs_map)]


@dataclass
class Explanation:
    """A method's map on the patch grid (B, gh, gw), with the logits (B, C) and the class
    (B,) it explains (the prediction unless a target was given)."""

    method: str
    map: torch.Tensor
    logits: torch.Tensor
    target: torch.Tensor


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


def explain_map(model, x: torch.Tensor, method: str = "rollout", target=None, *,
                layer: int = -1, head: int | str = "mean", residual: float = 0.5,
                discard_ratio: float = 0.0, head_fusion: str = "mean",
                outputs: tuple[torch.Tensor, list] | None = None) -> Explanation:
    """The (B, gh, gw) relevance of each patch under ``method`` (a name in :data:`METHODS`)
    for ``target``.

    ``cls``: [CLS] attention of ``layer`` with ``head`` an index or an explicit fusion;
    ``rollout``: attention rollout (``residual``, ``head_fusion``, ``discard_ratio``);
    ``grad-rollout``: gradient-weighted rollout; ``chefer``: Chefer et al. 2021;
    ``gradcam``: Grad-CAM on the last block's input tokens. Attention-only methods explain the
    predicted class whatever ``target`` is. ``outputs``: the (logits, maps) that
    ``model(x, return_attn=True)`` already gave for this ``x``; attention-only methods then
    reuse them instead of running the model again.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    m = METHODS[method]
    if method not in applicable(model.cfg):
        what = "a [CLS] readout" if m.needs_cls else "attention pooling (a MAP head)"
        pool = {"avg": "pools by average", "map": "pools by attention (a MAP head)",
                "cls": "reads its [CLS] token"}.get(getattr(model.cfg, "pool", ""), "is a CNN")
        raise ValueError(f"{method!r} explains {what}, and this model {pool}; methods that "
                         f"apply: {', '.join(applicable(model.cfg))}")
    options = dict(layer=layer, head=head, residual=residual, discard_ratio=discard_ratio,
                   head_fusion=head_fusion)
    grid_map, logits, chosen = m.compute(model, x, target, options, outputs)
    return Explanation(method, grid_map, logits, chosen)
