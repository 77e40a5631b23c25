"""The registry of attribution methods, and one entry point for all: ``explain_map``.

A method is a :class:`Method`: its name, a one-line summary, the ``explain_map`` options it
reads, whether it needs a [CLS] readout, whether it runs a backward pass, and a function
``(model, x, target, options, outputs) -> (map (B, gh, gw), logits (B, C), target (B,))``.
The methods vitkit ships are registered in :mod:`vitkit.explain.methods` (imported with
``vitkit.explain``); the CLI's ``--method`` choices, the error texts and any list shown to
users come from ``METHODS``. This module imports nothing else of vitkit, so any module of
``vitkit.explain`` can name the registered methods in its messages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vitkit.errors import ExplainError


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
        raise ExplainError(f"an attribution method called {method.name!r} is already registered")
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
    conservation: torch.Tensor | None = None  # (B,) |sum of relevance - logit| / |logit| (LRP)
    # LRP with budget=True: {part: (B,)} where the logit's relevance goes (lrp.BUDGET_PARTS)
    budget: dict[str, torch.Tensor] | None = None


def explain_map(model, x: torch.Tensor, method: str = "rollout", target=None, *,
                layer: int = -1, head: int | str = "mean", residual: float = 0.5,
                discard_ratio: float = 0.0, head_fusion: str = "mean",
                outputs: tuple[torch.Tensor, list] | None = None,
                budget: bool = False) -> Explanation:
    """The (B, gh, gw) relevance of each patch under ``method`` (a name in :data:`METHODS`)
    for ``target``.

    ``cls``: [CLS] attention of ``layer`` with ``head`` an index or an explicit fusion;
    ``rollout``: attention rollout (``residual``, ``head_fusion``, ``discard_ratio``);
    ``grad-rollout``: gradient-weighted rollout; ``chefer``: Chefer et al. 2021;
    ``gradcam``: Grad-CAM on the last block's input tokens. Attention-only methods explain the
    predicted class whatever ``target`` is. ``outputs``: the (logits, maps) that
    ``model(x, return_attn=True)`` already gave for this ``x``; attention-only methods then
    reuse them instead of running the model again. ``budget`` (LRP methods): also where each
    logit's relevance goes beside the pixels (``Explanation.budget``).
    """
    if method not in METHODS:
        raise ExplainError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    m = METHODS[method]
    if method not in applicable(model.cfg):
        what = "a [CLS] readout" if m.needs_cls else "attention pooling (a MAP head)"
        pool = {"avg": "pools by average", "map": "pools by attention (a MAP head)",
                "cls": "reads its [CLS] token"}.get(getattr(model.cfg, "pool", ""), "is a CNN")
        raise ExplainError(f"{method!r} explains {what}, and this model {pool}; methods that "
                         f"apply: {', '.join(applicable(model.cfg))}")
    options = dict(layer=layer, head=head, residual=residual, discard_ratio=discard_ratio,
                   head_fusion=head_fusion, budget=budget)
    # (map, logits, target), and for relevance methods the conservation error and the budget
    return Explanation(method, *m.compute(model, x, target, options, outputs))
