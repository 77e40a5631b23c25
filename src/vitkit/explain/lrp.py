"""Layer-wise relevance propagation for ViTs: AttnLRP (Achtibat et al., ICML 2024) and CP-LRP
(Ali et al., ICML 2022), in one backward pass through the model itself.

Both run as "gradient x input": inside :func:`relevance_mode` the model's own modules compute
the same forward, but their backward carries relevance rather than the plain gradient, so that
``x * d(logit)/dx`` at the pixels is the relevance of each pixel. The rules, module by module:

- linear layers and the patch embedding (convolution): the epsilon rule, which gradient x input
  is for a linear map (the relevance a bias takes is not passed on);
- LayerNorm: the identity rule through its normalisation: the standard deviation is held
  constant in the backward (the centring is linear), then the affine part is linear;
- GELU, tanh-GELU, QuickGELU: the identity rule (relevance passes through unchanged);
- LayerScale: an elementwise product with a parameter, linear in its input;
- attention (AttnLRP): the uniform rule on the two bilinear products, q k^T and A v, so values
  take half of the output's relevance and queries and keys a quarter each, and the softmax
  between them by its gradient (the paper's rule: the bias-free Taylor term);
- attention (CP-LRP): the attention weights held constant, so relevance flows through the
  values only.

Every readout vitkit builds is covered: [CLS], average pooling, DeiT's two tokens, registers
(they take relevance and pass it on like any token) and the MAP head (its attention follows the
same rule). The model is patched per instance for the duration of the call and restored after,
so no second copy is made.
"""

from __future__ import annotations

import contextlib
import types

import torch
import torch.nn.functional as F
from torch import nn

from vitkit.explain.gradients import targets
from vitkit.models.vit import Attention, MapHead, QuickGELU

RULES = ("attnlrp", "cp-lrp")
EPSILON = 1e-12  # keeps the identity rule's ratio finite where an activation's input is 0


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; the backward divides the relevance by ``factor`` (the uniform rule
    of a bilinear product, applied to each of its inputs)."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad / ctx.factor, None


class _IdentityRule(torch.autograd.Function):
    """``y = f(x)`` forward; backward passes ``y / x`` times the incoming gradient, so that
    ``x * grad_x = y * grad_y``: the relevance of y goes to x unchanged."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(y / torch.where(x.abs() < EPSILON, torch.full_like(x, EPSILON),
                                              x))
        return y

    @staticmethod
    def backward(ctx, grad):
        (ratio,) = ctx.saved_tensors
        return ratio * grad, None


def _scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return _ScaleGradient.apply(x, factor)


def _layer_norm(self: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    std = (x.var(-1, keepdim=True, unbiased=False) + self.eps).sqrt()
    y = (x - mean) / std.detach()
    return y * self.weight + self.bias if self.weight is not None else y


def _activation(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        y = self._lrp_original(x)
    return _IdentityRule.apply(x, y)


def _attend(q, k, v, rule: str):
    """softmax(q k^T / sqrt(d)) v with the rule's backward: (B, h, Tq, d) x3 -> (B, h, Tq, d)."""
    if rule == "attnlrp":
        q, k, v = _scale(q, 4.0), _scale(k, 4.0), _scale(v, 2.0)
    else:  # cp-lrp: the attention weights are constants
        q, k = q.detach(), k.detach()
    attn = ((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)).softmax(-1)
    return attn @ v, attn


def _attention(self, x: torch.Tensor, return_attn: bool = False, rows: int | None = None):
    """vitkit's Attention.forward with the rule in the middle (``rows`` as there)."""
    B, T, D = x.shape
    h, d = self.num_heads, self.head_dim
    qkv = self.qkv(x).reshape(B, T, 3, h, d).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # each (B, h, T, d)
    if rows is not None:
        q = q[:, :, :rows]
    y, attn = _attend(q, k, v, self._lrp_rule)
    y = y.transpose(1, 2).reshape(B, -1, D)
    return self.proj(y), (attn if return_attn else None)


def _map_head(self, x: torch.Tensor, return_attn: bool = False):
    """vitkit's MapHead.forward (attention pooling by a learned query) with the rule."""
    B, T, D = x.shape
    h, d = self.num_heads, D // self.num_heads
    q = self.q(self.latent).reshape(1, 1, h, d).transpose(1, 2).expand(B, -1, -1, -1)
    k, v = self.kv(x).reshape(B, T, 2, h, d).permute(2, 0, 3, 1, 4).unbind(0)
    y, attn = _attend(q, k, v, self._lrp_rule)
    y = self.proj(y.transpose(1, 2).reshape(B, 1, D))
    y = (y + self.mlp(self.norm(y)))[:, 0]
    return (y, attn[:, :, 0]) if return_attn else y


@contextlib.contextmanager
def relevance_mode(model: nn.Module, rule: str = "attnlrp"):
    """Within it, ``model``'s backward carries ``rule``'s relevance (see the module's rules);
    the modules are patched per instance and restored on the way out."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    activations = (nn.GELU, QuickGELU)
    patched = []
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            new = _layer_norm
        elif isinstance(module, activations):
            module._lrp_original = module.forward
            new = _activation
        elif isinstance(module, Attention):
            module._lrp_rule, new = rule, _attention
        elif isinstance(module, MapHead):
            module._lrp_rule, new = rule, _map_head
        else:
            continue
        patched.append(module)
        module.forward = types.MethodType(new, module)
    try:
        yield model
    finally:
        for module in patched:
            del module.forward  # back to the class's forward
            for name in ("_lrp_original", "_lrp_rule"):
                if name in module.__dict__:
                    delattr(module, name)


def relevance(model, x: torch.Tensor, target=None, rule: str = "attnlrp"):
    """Pixel relevance for each image's ``target`` logit (the prediction by default).

    Returns (relevance (B, H, W) summed over channels, logits (B, C), target (B,), and the
    conservation error (B,): |sum of relevance - logit| / |logit|, the share of the explained
    logit the pixels do not account for (biases and the softmax's Taylor remainder take it)).
    """
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad(), relevance_mode(model, rule):
            x = x.detach().clone().requires_grad_(True)
            logits = model(x)
            tgt = targets(logits, target)
            chosen = logits.gather(1, tgt[:, None])[:, 0]
            (grad,) = torch.autograd.grad(chosen.sum(), x)
    finally:
        model.train(was_training)
    pixels = (x * grad).sum(1).detach()  # (B, H, W)
    explained = chosen.detach()
    error = (pixels.flatten(1).sum(-1) - explained).abs() / explained.abs().clamp_min(1e-12)
    return pixels, logits.detach(), tgt, error


def to_patches(pixels: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, H, W) pixel relevance -> (B, H/P, W/P), summed within each patch."""
    return F.avg_pool2d(pixels[:, None], patch_size)[:, 0] * patch_size**2
