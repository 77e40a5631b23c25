"""Gradient-based attribution for the predicted (or a chosen) class, batched.

- ``grad_rollout``: rollout of relu(mean over heads of grad * A) (gradient-weighted rollout).
- ``chefer``: the generic rule of Chefer et al. 2021: R <- R + mean_h(relu(grad * A)) R.
- ``token_gradcam``: Grad-CAM on the tokens entering the last block.
Each layer's gradient is paired with that same layer's attention map (a common bug pairs the
gradients, collected in backward order, with the maps in reverse).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vitkit.explain.attention import Layout, layout_of
from vitkit.explain.rollout import rollout_fused
from vitkit.models.vit import patch_grid


@dataclass
class Attribution:
    """What one forward + backward gives: logits (B, C), target classes (B,), per-layer maps
    and their gradients (B, heads, T, T), and the token layout."""

    logits: torch.Tensor
    target: torch.Tensor
    maps: list[torch.Tensor]
    grads: list[torch.Tensor]
    layout: Layout


def targets(logits: torch.Tensor, target) -> torch.Tensor:
    if target is None:
        return logits.argmax(-1)
    target = torch.as_tensor(target, device=logits.device).long()
    return target.expand(logits.shape[0]) if target.dim() == 0 else target


def attention_gradients(model, x: torch.Tensor, target=None) -> Attribution:
    """Forward with all maps, then d(score of target)/d(map) for every layer.

    ``target``: None (each image's predicted class), an int, or (B,) ints. The score is the
    target logit; images are independent, so one backward serves the batch.
    """
    with torch.enable_grad():
        x = x.detach().requires_grad_(True)  # a graph even when the weights are frozen
        logits, maps = model(x, return_attn=True)
        target = targets(logits, target)
        score = logits.gather(1, target[:, None]).sum()
        grads = torch.autograd.grad(score, list(maps))  # grads[i] belongs to maps[i]
    return Attribution(logits.detach(), target, [m.detach() for m in maps],
                       [g.detach() for g in grads], layout_of(maps))


def grad_rollout(attr: Attribution, residual: float = 0.5,
                 discard_ratio: float = 0.0) -> torch.Tensor:
    """Gradient-weighted rollout -> (B, T, T): per layer relu(mean_h(grad * A)), then rollout."""
    fused = [(g * a).mean(1).clamp_min(0) for a, g in zip(attr.maps, attr.grads, strict=True)]
    return rollout_fused(fused, residual, discard_ratio,
                         protect_cls=attr.layout.readout is not None)


def chefer(attr: Attribution) -> torch.Tensor:
    """Chefer et al. 2021 generic attention explainability -> (B, T, T).

    R starts as the identity; per layer, first to last, A_bar = mean over heads of
    relu(grad * A) and R <- R + A_bar R.
    """
    first = attr.maps[0]
    eye = torch.eye(first.shape[-1], dtype=first.dtype, device=first.device)
    r = eye.expand(first.shape[0], -1, -1).clone()
    for a, g in zip(attr.maps, attr.grads, strict=True):
        a_bar = (g * a).clamp_min(0).mean(1)  # (B, T, T)
        r = r + a_bar @ r
    return r


def token_gradcam(model, x: torch.Tensor, target=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Grad-CAM on the tokens entering the last block -> (map (B, gh, gw), logits (B, C)).

    Channel weights are the patch-averaged gradients of the target score with respect to those
    tokens; the map is relu of the weighted channel sum at each patch.
    """
    captured: dict[str, torch.Tensor] = {}

    def keep_input(module, args):
        captured["tokens"] = args[0]

    handle = model.blocks[-1].register_forward_pre_hook(keep_input)
    try:
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            logits = model(x)
            target = targets(logits, target)
            score = logits.gather(1, target[:, None]).sum()
            tokens = captured["tokens"]  # (B, T, D)
            (grad,) = torch.autograd.grad(score, tokens)
    finally:
        handle.remove()
    p = model.num_prefix_tokens
    acts, grads = tokens.detach()[:, p:], grad[:, p:]  # (B, N, D)
    weights = grads.mean(1, keepdim=True)  # (B, 1, D)
    cam = (acts * weights).sum(-1).clamp_min(0)  # (B, N)
    gh, gw = patch_grid(x.shape[-2:], model.cfg.patch_size)
    return cam.reshape(-1, gh, gw), logits.detach()
