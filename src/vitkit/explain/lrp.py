"""Layer-wise relevance propagation for ViTs: AttnLRP (Achtibat et al., ICML 2024) and CP-LRP
(Ali et al., ICML 2022), in one backward pass through the model itself.

Both run as "gradient x input": inside :func:`relevance_mode` the model's own modules compute
the same forward, but their backward carries relevance rather than the plain gradient, so that
``x * d(logit)/dx`` at the pixels is the relevance of each pixel. The rules, module by module:

- linear layers and the patch embedding (convolution): the epsilon rule, which gradient x input
  is for a linear map (the relevance a bias takes is not passed on);
- LayerNorm: the identity rule through its normalisation: the standard deviation is held
  constant in the backward (the centring is linear), then the affine part is linear;
- GELU, tanh-GELU, QuickGELU, SiLU: the identity rule (relevance passes through unchanged);
- the gate of a SwiGLU MLP (SiLU(g) * v): the uniform rule, half of the product's relevance to
  each factor;
- rotary embeddings: a rotation of q and k, linear, so relevance passes as through any linear
  map (nothing to swap);
- LayerScale: an elementwise product with a parameter, linear in its input;
- attention (AttnLRP): the uniform rule on the two bilinear products, q k^T and A v, so values
  take half of the output's relevance and queries and keys a quarter each, and the softmax
  between them by its gradient (the paper's rule: the bias-free Taylor term);
- attention (CP-LRP): the attention weights held constant, so relevance flows through the
  values only.

Every readout vitkit builds is covered: [CLS], average pooling, DeiT's two tokens, registers
(they take relevance and pass it on like any token) and the MAP head (its attention follows the
same rule). The modules run their own forward: the attention kernel (``Attention.kernel``,
``MapHead.kernel``) and the backward of LayerNorms, activations and the gate are swapped per
instance for the duration of the call and restored after, so no second copy of the forward
(or of the model) exists.
"""

from __future__ import annotations

import contextlib
import types

import torch
import torch.nn.functional as F
from torch import nn

from vitkit.errors import ExplainError
from vitkit.explain.gradients import targets
from vitkit.models.vit import Attention, MapHead, Product, QuickGELU

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


def _kernel(rule: str):
    """An attention kernel (the signature of ``vitkit.models.vit.sdpa_attention``) whose
    backward is ``rule``'s; the modules' own forward runs around it."""
    def kernel(q, k, v, dropout_p: float = 0.0, return_attn: bool = False):
        y, attn = _attend(q, k, v, rule)
        return y, (attn if return_attn else None)
    return kernel


def _gate(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The GLU's product a * b by the uniform rule: each factor takes half the relevance."""
    return _scale(a, 2.0) * _scale(b, 2.0)


@contextlib.contextmanager
def relevance_mode(model: nn.Module, rule: str = "attnlrp"):
    """Within it, ``model``'s backward carries ``rule``'s relevance (see the module's rules).
    The modules keep their own forward; what is swapped, per instance and restored on the way
    out, is a part: the attention kernel, a LayerNorm's or an activation's backward, the gate
    product's. Rotary embeddings are a rotation, linear in q and k, and need no rule."""
    if rule not in RULES:
        raise ExplainError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    activations = (nn.GELU, QuickGELU, nn.SiLU)
    patched = []
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            name, new = "forward", types.MethodType(_layer_norm, module)
        elif isinstance(module, activations):
            module._lrp_original = module.forward
            name, new = "forward", types.MethodType(_activation, module)
        elif isinstance(module, Product):
            name, new = "forward", types.MethodType(_gate, module)
        elif isinstance(module, (Attention, MapHead)):
            name, new = "kernel", _kernel(rule)
        else:
            continue
        patched.append((module, name))
        setattr(module, name, new)
    try:
        yield model
    finally:
        for module, name in patched:
            delattr(module, name)  # back to the class's own
            if "_lrp_original" in module.__dict__:
                del module._lrp_original


# Where a logit's relevance goes, beside the pixels: the inputs a ViT has that are not pixels
# (its position table, its learned tokens) and the biases, which take relevance by the epsilon
# rule and pass none on; what is left is the rules' own remainder (AttnLRP's softmax rule is not
# conservative; CP-LRP's and the identity rules are, so for CP-LRP it is rounding only).
BUDGET_PARTS = ("pixels", "position_table", "tokens", "biases", "remainder")
BUDGET_LABELS = {"pixels": "pixels", "position_table": "position table",
                 "tokens": "[CLS], registers, MAP query", "biases": "biases",
                 "remainder": "the rules' remainder"}


def _sources(model) -> dict[str, list[torch.Tensor]]:
    """The model's inputs other than the pixels, by budget part: the position table, the
    learned tokens ([CLS], distillation, registers, the MAP head's query), every bias."""
    tokens = [getattr(model, n, None) for n in ("cls_token", "dist_token", "reg_token")]
    pool = getattr(model, "attn_pool", None)
    tokens.append(pool.latent if pool is not None else None)
    pos = getattr(model, "pos_embed", None)
    return {"position_table": [pos] if pos is not None else [],
            "tokens": [t for t in tokens if t is not None],
            "biases": [p for n, p in model.named_parameters() if n.endswith("bias")]}


def relevance(model, x: torch.Tensor, target=None, rule: str = "attnlrp",
              budget: bool = False):
    """Pixel relevance for each image's ``target`` logit (the prediction by default).

    Returns (relevance (B, H, W) summed over channels, logits (B, C), target (B,), and the
    conservation error (B,): |sum of relevance - logit| / |logit|, the share of the explained
    logit the pixels do not account for). With ``budget``, a fifth value: where the whole
    logit goes, {part: (B,)} for each of :data:`BUDGET_PARTS`, summing to the logit (the
    relevance of the position table, the learned tokens and the biases, each the sum of
    ``value * relevance gradient`` over its entries; the remainder what no input takes). The
    parameters' shares are per image, so a batch is explained one image at a time then.
    """
    if budget and x.shape[0] > 1:
        parts = [relevance(model, x[i:i + 1], None if target is None else
                           targets(torch.zeros(x.shape[0], 1), target)[i:i + 1], rule, True)
                 for i in range(x.shape[0])]
        pixels, logits, tgt, error = (torch.cat([p[i] for p in parts]) for i in range(4))
        return pixels, logits, tgt, error, {k: torch.cat([p[4][k] for p in parts])
                                            for k in BUDGET_PARTS}
    was_training = model.training
    model.eval()
    sources = _sources(model) if budget else {}
    flat = [t for ts in sources.values() for t in ts]
    try:
        with torch.enable_grad(), relevance_mode(model, rule):
            x = x.detach().clone().requires_grad_(True)
            logits = model(x)
            tgt = targets(logits, target)
            chosen = logits.gather(1, tgt[:, None])[:, 0]
            grad, *grads = torch.autograd.grad(chosen.sum(), [x, *flat], allow_unused=True)
    finally:
        model.train(was_training)
    pixels = (x * grad).sum(1).detach()  # (B, H, W)
    explained = chosen.detach()
    error = (pixels.flatten(1).sum(-1) - explained).abs() / explained.abs().clamp_min(1e-12)
    if not budget:
        return pixels, logits.detach(), tgt, error
    out = {"pixels": pixels.flatten(1).sum(-1)}
    taken = iter(grads)
    for part, tensors in sources.items():
        share = torch.zeros(())
        for t in tensors:
            g = next(taken)
            share = share + ((t * g).sum() if g is not None else 0.0)
        out[part] = share.detach().reshape(1)
    out["remainder"] = explained - sum(out[k] for k in BUDGET_PARTS[:-1])
    return pixels, logits.detach(), tgt, error, out


def to_patches(pixels: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, H, W) pixel relevance -> (B, H/P, W/P), summed within each patch."""
    return F.avg_pool2d(pixels[:, None], patch_size)[:, 0] * patch_size**2
