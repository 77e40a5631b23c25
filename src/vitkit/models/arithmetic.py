"""The arithmetic of a block's steps, apart from the block: one forward, several ways to compute it.

``Attention``, ``Mlp``, ``SwiGLU`` and ``Block`` (models/vit.py) each have one forward, written
as the steps of :class:`Arithmetic`. The standard arithmetic runs them through the modules;
the in-place CPU path (models/inference.py) swaps in its own, the relevance rules swap the
attention kernel and backward rules, and the ONNX export traces the standard one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, T, h*d) -> (B, h, T, d)."""
    B, T, _ = t.shape
    return t.reshape(B, T, heads, -1).transpose(1, 2)


class Arithmetic:
    """How the steps of a block are computed: the standard arithmetic, through the modules
    (autograd, hooks, any device, ``torch.compile``, the ONNX trace).

    ``Attention``, ``Mlp``, ``SwiGLU`` and ``Block`` each have one forward, written as these
    steps; a path that computes them otherwise swaps the arithmetic, never the forward: the
    CPU inference path (``models/inference.py``'s ``InPlace``) computes the same steps in place
    in reused buffers. Shapes: x (B, T, D); q (B, h, R, d) for the R rows that ask (R = T, or
    the readout rows of the last block); k, v (B, h, T, d).
    """

    def qkv(self, attn: nn.Module, x: torch.Tensor, rows: int | None, rotary: bool):
        """The heads' q, k, v of x (B, T, D); with ``rows``, q for the first ``rows`` only."""
        B, T, D = x.shape
        h, b = attn.num_heads, attn.bias()
        plain = isinstance(attn.qkv, nn.Linear)  # else an adapter around it (LoRA): call it
        if rows is None or not plain:
            if attn.q_bias is None:
                qkv = attn.qkv(x)
            else:  # the split biases: the layer has none of its own
                qkv = F.linear(x, attn.qkv.weight, b) if plain else attn.qkv(x) + b
            q, k, v = qkv.reshape(B, T, 3, h, -1).permute(2, 0, 3, 1, 4).unbind(0)
            return (q if rows is None else q[:, :, :rows]), k, v
        w = attn.qkv.weight
        q = split_heads(F.linear(x[:, :rows], w[:D], None if b is None else b[:D]), h)
        k, v = F.linear(x, w[D:], None if b is None else b[D:]) \
            .reshape(B, T, 2, h, -1).permute(2, 0, 3, 1, 4).unbind(0)  # each (B, h, T, d)
        return q, k, v

    def rotate(self, table, q: torch.Tensor, k: torch.Tensor):
        """q and k with their patch rows turned by the rotary table."""
        return table.apply(q, k)

    def attend(self, kernel, q, k, v, dropout_p: float, return_attn: bool):
        """The attention kernel: ((B, h, R, d), maps (B, h, R, T) or None)."""
        return kernel(q, k, v, dropout_p, return_attn)

    def project(self, attn: nn.Module, o: torch.Tensor) -> torch.Tensor:
        """The heads' outputs (B, h, R, d) through the output projection: (B, R, D)."""
        B, h, R, d = o.shape
        return attn.proj(o.transpose(1, 2).reshape(B, R, h * d))

    def linear(self, layer: nn.Linear, x: torch.Tensor, name: str) -> torch.Tensor:
        """``layer(x)``; ``name`` says which buffer an in-place arithmetic may write it to."""
        return layer(x)

    def act(self, act: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return act(x)

    def gate(self, product: nn.Module, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return product(a, b)

    def residual(self, x: torch.Tensor, branch: torch.Tensor, ls: nn.Module,
                 drop_path: nn.Module) -> torch.Tensor:
        """x + drop_path(ls(branch))."""
        return x + drop_path(ls(branch))


STANDARD = Arithmetic()
