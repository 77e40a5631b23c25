"""The CPU inference path: the same blocks, their steps computed in place.

A ViT forward is mostly matrix products, and on a CPU the best libraries already run those at
the machine's matmul peak; what is left to win is everything around them. Under
``torch.no_grad()`` / ``torch.inference_mode()`` a model in eval mode on the CPU runs the one
``Block.forward`` with :class:`InPlace` as its arithmetic (``models/arithmetic.py``): the
forward, its steps and their order are the standard path's, and only how each step is
computed differs:

- the residual stream is this forward's own (B, T, D) tensor, updated in place
  (``x += branch``, LayerScale as ``x.addcmul_(branch, gamma)``), instead of a fresh tensor
  per residual;
- qkv, the MLP hidden layer and the branch outputs go into buffers reused by every block, each
  linear layer a single ``addmm`` into its buffer, and GELU, SiLU and SwiGLU's gate run in
  place, so a forward touches a few fresh pages instead of several per block;
- biases the softmax cannot see are not added at all: the key bias adds ``q . b_k`` to a whole
  row of scores, which softmax ignores; the value bias passes through attention unchanged (each
  row of weights sums to 1), so it is folded into the output projection's bias
  (``b_proj + W_proj b_v``). Only the query bias is added, and the key bias where rotary
  embeddings turn each key by its own angle (the softmax no longer ignores it then).

The readout rows of the last block ([CLS], DeiT's distillation token) are the standard path's
``rows``: keys and values from every token, queries, projection and MLP for those rows only.
Rotary embeddings turn the patch rows of q and k inside the qkv buffer.

All of it is exact algebra, so the outputs equal the standard path's up to float rounding
(about 1e-6; tests pin both paths against each other and against timm). Autograd, training,
autocast, hooks and ``torch.compile`` take the standard arithmetic; so does any device other
than the CPU, where fused bias epilogues and a caching allocator already give what this saves.
``model.inplace_inference = False`` turns it off.

What it computes is declared field by field of ``ViTConfig``: :data:`SUPPORTS` (computed as the
standard blocks do, whatever the value) and :data:`REFUSES` (a model whose value differs from
the default runs the standard blocks; :func:`applies` says no). ``ViTConfig.NEUTRAL`` fields
change nothing in eval mode. A field in none of the three is refused too, until it is declared
(tests/test_options_contract.py fails meanwhile).
"""

from __future__ import annotations

import functools
from dataclasses import MISSING, fields

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module

from vitkit.models import rope
from vitkit.models.arithmetic import Arithmetic

# Everything outside the blocks runs as written (patch embedding, prefix tokens, position
# table, pre-norm, pooling, heads); inside them the in-place arithmetic reads each layer's own
# shapes, biases, LayerNorm eps and LayerScale, rotary tables and MLP kind.
SUPPORTS: frozenset[str] = frozenset({
    "img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads",
    "mlp_dim", "pool", "class_token", "distilled", "num_reg_tokens", "no_embed_class",
    "representation_size", "fc_norm", "qkv_bias", "init_values", "pre_norm", "patch_bias",
    "head_bias", "norm_eps", "dynamic_img_size", "pos_antialias", "pool_heads", "key_bias",
    "pos_interp", "abs_pos", "rope", "rope_temperature", "rope_offset", "rope_xy", "rope_half",
    "rope_ref_grid", "mlp", "mlp_norm", "act",
})
# Exact GELU and SiLU run in place; QuickGELU and tanh-GELU through their modules.
REFUSES: frozenset[str] = frozenset()


class Workspace:
    """Buffers shared by every block of one forward, made on first use and then reused.

    ``ws.buffer("qkv", (N, 3 * D), like=x)`` returns the same tensor to every block; a buffer
    must never be returned to the caller (the next block overwrites it).
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def buffer(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(name)
        if buf is None or buf.shape != shape:
            buf = self._buffers[name] = like.new_empty(shape)
        return buf


def applies(model: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``model``'s forward on ``x`` may take the in-place path."""
    return (
        getattr(model, "inplace_inference", True)
        and not torch.is_grad_enabled()
        and not model.training
        and x.device.type == "cpu"
        and not torch.is_autocast_enabled("cpu")  # autocast chooses dtypes per op
        and not torch.compiler.is_compiling()
        and not _hooked(model)
        and not unsupported(model.cfg)
    )


def unsupported(cfg) -> list[str]:
    """The fields of ``cfg`` that keep it off the in-place path: those with a value other than
    the default that are neither in :data:`SUPPORTS` nor neutral (``act="quick_gelu"``, ...)."""
    return [name for name, default in _checked(type(cfg)) if getattr(cfg, name) != default]


@functools.cache
def _checked(config_class: type) -> tuple[tuple[str, object], ...]:
    """(field, default) of every field of ``config_class`` neither supported nor neutral."""
    neutral = getattr(config_class, "NEUTRAL", frozenset())
    return tuple(
        (f.name, f.default if f.default_factory is MISSING else f.default_factory())
        for f in fields(config_class) if f.name not in SUPPORTS and f.name not in neutral)


def _hooked(model: nn.Module) -> bool:
    """Any forward hook on the model or its parts (they expect the standard calls)."""
    if _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return True
    return any(mod._forward_hooks or mod._forward_pre_hooks for mod in model.modules())


class InPlace(Arithmetic):
    """The steps of ``Block.forward`` computed in place (see the module docstring): the
    residual stream x (B, T, D) is this forward's own tensor and is updated in place; qkv, the
    hidden layer and the branch outputs go into :class:`Workspace` buffers that every block
    reuses. One instance per forward (it holds the buffers)."""

    def __init__(self) -> None:
        self.ws = Workspace()
        self.biases: dict[int, torch.Tensor | None] = {}  # each attention's qkv bias, once

    def _bias(self, attn) -> torch.Tensor | None:
        """``attn.bias()`` (a concatenation where q and v have their own biases), computed
        once per forward: qkv and project both need it."""
        if id(attn) not in self.biases:
            self.biases[id(attn)] = attn.bias()
        return self.biases[id(attn)]

    def _mm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
            name: str, rows: int | None = None) -> torch.Tensor:
        """x (..., K) @ weight.T (+ bias) into the buffer ``name``: (..., M)."""
        x2 = x.reshape(-1, x.shape[-1])
        out = self.ws.buffer(name, (x2.shape[0], weight.shape[0]), x)
        if bias is None:
            torch.mm(x2, weight.t(), out=out)
        else:
            torch.addmm(bias, x2, weight.t(), out=out)
        return out.view(*x.shape[:-1], weight.shape[0])

    def qkv(self, attn, x, rows, rotary):
        # no key bias (the softmax ignores it) unless keys are turned; the value bias is folded
        # into the output projection (project)
        B, T, D = x.shape
        h, b = attn.num_heads, self._bias(attn)
        w = attn.qkv.weight
        if rows is None:
            qkv = self._mm(x, w, None, "qkv")  # (B, T, 3D)
            kv = qkv[..., D:]
        else:
            kv = self._mm(x, w[D:], None, "qkv")  # (B, T, 2D); q of the readout rows below
        if b is not None and rotary:
            kv[..., :D].add_(b[D:2 * D])
        if rows is None:
            if b is not None:
                qkv[..., :D].add_(b[:D])
            return qkv.view(B, T, 3, h, -1).permute(2, 0, 3, 1, 4).unbind(0)
        q = F.linear(x[:, :rows], w[:D], None if b is None else b[:D])
        k, v = kv.view(B, T, 2, h, -1).permute(2, 0, 3, 1, 4).unbind(0)
        return q.view(B, rows, h, -1).transpose(1, 2), k, v

    def rotate(self, table, q, k):
        sin, cos = table.sin, table.cos  # (N, d), or (h, N, d): broadcast over (B, h, N, d)
        for t in (q, k):
            if t.shape[2] > table.prefix:  # a q of readout rows only is not turned
                rows = t[:, :, table.prefix:]
                rows.copy_(rope.rotate(rows, sin, cos, table.half))
        return q, k

    def attend(self, kernel, q, k, v, dropout_p, return_attn):
        if return_attn:
            return attention_with_maps(q, k, v, self.ws)
        return F.scaled_dot_product_attention(q, k, v), None

    def project(self, attn, o):
        B, h, R, d = o.shape
        bias = attn.proj.bias
        b = self._bias(attn)
        if b is not None:  # the value bias passes through attention: b_proj + W_proj b_v
            bias = torch.addmv(bias, attn.proj.weight, b[2 * h * d:])
        return self._mm(o.transpose(1, 2).reshape(B, R, h * d), attn.proj.weight, bias,
                        "branch")

    def linear(self, layer, x, name):
        return self._mm(x, layer.weight, layer.bias, name)

    def act(self, act, x):
        if isinstance(act, nn.GELU) and act.approximate == "none":
            return torch.ops.aten.gelu_(x)
        if isinstance(act, nn.SiLU):
            return F.silu(x, inplace=True)
        return act(x)

    def gate(self, product, a, b):
        return a.mul_(b)

    def residual(self, x, branch, ls, drop_path):
        gamma = getattr(ls, "gamma", None)
        return x.add_(branch) if gamma is None else x.addcmul_(branch, gamma)


def attention_with_maps(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ws: Workspace):
    """softmax(q k^T / sqrt(d)) v with the weights kept: q (B, h, R, d), k, v (B, h, T, d) ->
    ((B, h, R, d), maps).

    The maps are (B, h, R, T), each row summing to 1, as ``sdpa_attention`` returns them, and
    are the only fresh memory: one copy puts q, k and v head-major in a workspace buffer so
    both products are plain batched GEMMs, and the softmax runs in place in the scores, which
    become the returned maps.
    """
    B, h, T, d = k.shape
    R = q.shape[2]
    keys = ws.buffer("heads", (2, B, h, T, d), k)
    keys[0].copy_(k)
    keys[1].copy_(v)
    query = ws.buffer("query", (B, h, R, d), q)
    torch.mul(q, d ** -0.5, out=query)  # q, scaled on the way
    k2, v2 = keys.view(2, B * h, T, d).unbind(0)
    scores = torch.bmm(query.view(B * h, R, d), k2.transpose(1, 2))  # (B*h, R, T)
    torch.ops.aten._softmax.out(scores, -1, False, out=scores)  # row-wise: safe in place
    o = torch.bmm(scores, v2, out=ws.buffer("heads_out", (B * h, R, d), q))
    return o.view(B, h, R, d), scores.view(B, h, R, T)
