"""What the explorer offers for a model, and the checks of every argument a request names.

Pure functions of the model's config (``cfg``: a :class:`~vitkit.models.vit.ViTConfig`
object) and sizes: the names of its classes and prefix tokens, the methods that do not apply
and why, and one check per argument (layer, head, class, token, rollout settings, method,
measure). Each refusal is a :class:`~vitkit.errors.VitkitError` saying what exists.
"""

from __future__ import annotations

import torch

from vitkit.errors import VitkitError
from vitkit.explain import causal
from vitkit.explain.attention import HEAD_FUSIONS
from vitkit.explain.methods import METHODS, applicable

NO_HEAD = ("the checkpoint has no classifier head (it gives features, num_classes=0), so "
           "there is no class to explain")


def class_names(cfg) -> list[str]:
    """The ``cfg.num_classes`` class names: the checkpoint's own, or "class i"."""
    names = cfg.extra.get("class_names")
    n = cfg.num_classes
    return list(names)[:n] if names and len(names) >= n else [f"class {i}" for i in range(n)]


def token_names(cfg) -> list[str]:
    """Names of the prefix tokens, in sequence order ([CLS], [DIST], [REG0], ...)."""
    names = (["[CLS]"] if cfg.class_token else []) + (["[DIST]"] if cfg.distilled else [])
    return names + [f"[REG{i}]" for i in range(cfg.num_reg_tokens)]


def unavailable_methods(cfg, has_classifier: bool) -> dict[str, str]:
    """Methods (and views) that do not apply to this model -> the reason."""
    out = {}
    usable = applicable(cfg)
    for name, m in METHODS.items():
        if name not in usable:
            out[name] = ("the model has no [CLS] readout (it pools by "
                         f"{'average' if cfg.pool == 'avg' else 'attention'})"
                         if m.needs_cls else "the model has no MAP head (attention pooling)")
        elif m.gradients and not has_classifier:
            out[name] = NO_HEAD
    return out


def layer_index(layer: int, depth: int) -> int:
    """``layer`` (negative counts from the end) as 0..depth-1."""
    if not -depth <= layer < depth:
        raise VitkitError(f"layer {layer} does not exist: the model has {depth} "
                          f"layers (0..{depth - 1})")
    return layer % depth


def head_choice(head: int | str, heads: int) -> int | str:
    """A head index (as text or int) 0..heads-1, or a fusion named explicitly."""
    if isinstance(head, str) and head in HEAD_FUSIONS:
        return head
    try:
        index = int(head)
    except (TypeError, ValueError):
        index = None
    if index is None or not 0 <= index < heads:
        raise VitkitError(f"head {head!r} does not exist: the model has {heads} heads "
                          f"per layer (0..{heads - 1}); or fuse them by name: "
                          f"{', '.join(HEAD_FUSIONS)}")
    return index


def class_index(target: int | None, logits: torch.Tensor, has_classifier: bool) -> int:
    """``target``, or the predicted class of ``logits`` (1, classes) when None."""
    if not has_classifier:
        raise VitkitError(NO_HEAD)
    n = logits.shape[-1]
    if target is None:
        return int(logits.argmax())
    if not 0 <= target < n:
        raise VitkitError(f"class {target} does not exist: the model has {n} classes "
                          f"(0..{n - 1})")
    return target


def token_index(token: int, tokens: int, prefix: int, grid: tuple[int, int]) -> int:
    """``token`` within a sequence of ``tokens``: ``prefix`` tokens, then the grid's
    patches row by row."""
    if not 0 <= token < tokens:
        raise VitkitError(f"token {token} does not exist: the image has {tokens} tokens "
                          f"(0..{tokens - 1}; {prefix} prefix tokens, then the "
                          f"{grid[0]}x{grid[1]} patches row by row)")
    return token


def fusion_name(fusion: str) -> str:
    """A head fusion: mean, max or min."""
    if fusion not in HEAD_FUSIONS:
        raise VitkitError(f"fusion must be one of {', '.join(HEAD_FUSIONS)}, got {fusion!r}")
    return fusion


def rollout_settings(residual: float, fusion: str, discard_ratio: float) -> None:
    """Rollout's settings: residual in [0, 1], discard ratio in [0, 1) (NaN fails both)."""
    if not (0 <= residual <= 1 and 0 <= discard_ratio < 1):
        raise VitkitError(f"residual must be in [0, 1] and discard ratio in [0, 1); got "
                          f"{residual} and {discard_ratio}")
    fusion_name(fusion)


def method_name(method: str, cfg, unavailable: dict[str, str]) -> str:
    """A method of :data:`~vitkit.explain.methods.METHODS` that applies (not in
    ``unavailable``, as :func:`unavailable_methods` gives it)."""
    if method not in METHODS:
        raise VitkitError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if method in unavailable:
        raise VitkitError(f"{method!r} does not apply: {unavailable[method]}; "
                          f"methods that apply: {', '.join(applicable(cfg))}")
    return method


def measure_name(measure: str) -> str:
    """What head ablation measures: one of :data:`~vitkit.explain.causal.MEASURES`."""
    if measure not in causal.MEASURES:
        raise VitkitError(f"measure must be one of {', '.join(causal.MEASURES)}, got "
                          f"{measure!r}")
    return measure


ARCHITECTURE = ("depth", "num_heads", "embed_dim", "patch_size", "img_size", "pool",
                "class_token", "num_reg_tokens", "distilled")


def same_architecture(a, b) -> None:
    """Refuse a comparison checkpoint whose architecture differs from the explored one's (the
    views compare layer by layer and head by head)."""
    differ = [f"{k} {getattr(a, k, None)!r} vs {getattr(b, k, None)!r}" for k in ARCHITECTURE
              if getattr(a, k, None) != getattr(b, k, None)]
    if differ:
        raise VitkitError("--compare-checkpoint must have the same architecture as --checkpoint "
                          "(the views compare layer by layer and head by head); they differ in "
                          + ", ".join(differ))
