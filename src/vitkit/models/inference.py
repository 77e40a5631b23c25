"""The CPU inference path: the same blocks, computed in place with fewer passes over memory.

A ViT forward is mostly matrix products, and on a CPU the best libraries already run those at
the machine's matmul peak; what is left to win is everything around them. Under
``torch.no_grad()`` / ``torch.inference_mode()`` a model in eval mode on the CPU runs its
blocks through :func:`block_inplace`, which differs from ``Block.forward`` only in how the same
numbers are computed:

- the residual stream is one (B*T, D) buffer updated in place: ``x += proj(o)`` and
  ``x += fc2(h)`` are single GEMMs that accumulate into ``x`` (``addmm_``), instead of a
  product, a bias copy, and an add into a fresh tensor;
- the qkv and MLP hidden activations go into two buffers reused by every block, and GELU runs
  in place, so a forward touches a few fresh pages instead of several per block;
- biases the softmax cannot see are not added at all: the key bias adds ``q . b_k`` to a whole
  row of scores, which softmax ignores; the value bias passes through attention unchanged (each
  row of weights sums to 1), so it is folded into the output projection's bias
  (``b_proj + W_proj b_v``, a D-vector per block per call). Only the query bias is added.

And when only the logits are asked for from a [CLS]-pooled model, the last block computes only
the rows the head reads ([CLS], and DeiT's distillation token): keys and values still come
from every token, but the query, output projection and MLP of the other rows are never
computed, since nothing reads them (:func:`last_block_readout`, about 1/depth of the work).

Rotary embeddings turn the patch rows of q and k in the qkv buffer (``_rotate_``, the rotation
of ``models/rope.py``), after adding the key bias, which the softmax no longer ignores once
each key is turned by its own angle; SwiGLU's gate is computed in the hidden buffer.

All of it is exact algebra, so the outputs equal the standard path's up to float rounding
(about 1e-6; tests pin both paths against each other and against timm). Autograd, training,
autocast, hooks and ``torch.compile`` take the standard path; so does any device other than
the CPU, where fused bias epilogues and a caching allocator already give what this saves.
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

# Everything outside the blocks runs as written (patch embedding, prefix tokens, position
# table, pre-norm, pooling, heads); inside them the in-place arithmetic reads each layer's own
# shapes, biases (qkv_bias: none is added), LayerNorm eps and LayerScale (folded into the
# branch's last linear layer).
# Rotary embeddings turn the patch rows of q and k inside the qkv buffer (the key bias added
# first: after a rotation it is no longer the same for every key); SwiGLU runs its gate in the
# hidden buffers, with the hidden LayerNorm where the model has one.
SUPPORTS: frozenset[str] = frozenset({
    "img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads",
    "mlp_dim", "pool", "class_token", "distilled", "num_reg_tokens", "no_embed_class",
    "representation_size", "fc_norm", "qkv_bias", "init_values", "pre_norm", "patch_bias",
    "head_bias", "norm_eps", "dynamic_img_size", "pos_antialias", "pool_heads", "key_bias",
    "pos_interp", "abs_pos", "rope", "rope_temperature", "rope_offset", "rope_xy", "rope_half",
    "rope_ref_grid", "mlp", "mlp_norm",
})
# The in-place GELU MLP computes exact GELU only: QuickGELU and tanh-GELU blocks run as written.
REFUSES: frozenset[str] = frozenset({"act"})


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


def block_inplace(block: nn.Module, x: torch.Tensor, batch: int, ws: Workspace,
                  return_attn: bool = False, rope_table=None) -> torch.Tensor | None:
    """One pre-norm block on the residual stream x (N, D), N = B*T, updated in place;
    ``rope_table`` (a ``RopeTable``) turns the patch rows of q and k as ``Block.forward`` does.

    Returns the block's attention maps (B, h, T, T) when ``return_attn``, else None.
    """
    attn = block.attn
    N, D = x.shape
    T, h = N // batch, attn.num_heads
    # attention: qkv without bias; add only the query's (see the module docstring)
    y = F.layer_norm(x, (D,), block.norm1.weight, block.norm1.bias, block.norm1.eps)
    qkv = torch.mm(y, attn.qkv.weight.t(), out=ws.buffer("qkv", (N, 3 * D), x))
    b_q, proj_bias = _query_and_output_biases(attn)
    if b_q is not None:
        qkv[:, :D].add_(b_q)
    if rope_table is not None:
        _rotate_(qkv.view(batch, T, 3, h, D // h), attn, rope_table, (0, 1))
    if return_attn:
        o, maps = attention_with_maps(qkv, batch, h, ws)
    else:
        q, k, v = qkv.view(batch, T, 3, h, D // h).permute(2, 0, 3, 1, 4).unbind(0)
        o, maps = F.scaled_dot_product_attention(q, k, v), None  # (B, h, T, d)
    o = o.transpose(1, 2).reshape(N, D)
    proj_w, proj_bias = _layer_scaled(block.ls1, attn.proj.weight, proj_bias)
    x.add_(proj_bias).addmm_(o, proj_w.t())
    _mlp_residual_(block, x, ws, N)
    return maps


def _rotate_(heads: torch.Tensor, attn: nn.Module, table, parts: tuple[int, ...]) -> None:
    """Turn, in place, the patch rows of the parts ``parts`` (0: q, 1: k of a qkv view; 0: k of
    a kv view) of ``heads`` (B, T, parts, h, d) by ``table``, after adding the key bias: the
    softmax ignores a key bias only while every key is turned alike."""
    key = parts[-1]
    bias = attn.bias()
    if bias is not None:
        D = heads.shape[-1] * heads.shape[-2]
        heads[:, :, key].add_(bias[D:2 * D].view(heads.shape[-2], -1))
    sin, cos = table.sin, table.cos  # (N, d), or (h, N, d) for learned frequencies
    if sin.dim() == 3:
        sin, cos = sin.transpose(0, 1), cos.transpose(0, 1)  # (N, h, d)
    else:
        sin, cos = sin[:, None], cos[:, None]  # (N, 1, d)
    for p in parts:
        rows = heads[:, table.prefix:, p]  # (B, N, h, d)
        rows.copy_(rope.rotate(rows, sin, cos, table.half))


def _mlp_residual_(block: nn.Module, x: torch.Tensor, ws: Workspace, n: int) -> None:
    """x += fc2(GELU(fc1(LN2(x)))) in place, or SwiGLU's fc2(norm(SiLU(g) * v)): x (k, D),
    k <= n; the hidden activations go into a workspace buffer of n rows (shared by every block).

    fc1 goes into the buffer, its bias and the exact GELU are applied there in place (for
    SwiGLU: SiLU on the gate, times the value, into the gate's rows), and fc2 accumulates
    straight into ``x`` after its bias.
    """
    mlp, norm = block.mlp, block.norm2
    k = x.shape[0]
    y = F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, norm.eps)
    fc2_w, fc2_b = _layer_scaled(block.ls2, mlp.fc2.weight, mlp.fc2.bias)
    H = fc2_w.shape[1]
    if getattr(mlp, "packed", False):  # SwiGLU with fc1 giving [gate | value]
        both = ws.buffer("hidden", (n, 2 * H), x)[:k]
        torch.addmm(mlp.fc1.bias, y, mlp.fc1.weight.t(), out=both)
        gate, value = both.split(H, dim=1)
        hidden = F.silu(gate, inplace=True).mul_(value)
    elif hasattr(mlp, "fc1_g"):  # SwiGLU with split first layers
        gate = ws.buffer("hidden", (n, H), x)[:k]
        torch.addmm(mlp.fc1_g.bias, y, mlp.fc1_g.weight.t(), out=gate)
        hidden = F.silu(gate, inplace=True).mul_(F.linear(y, mlp.fc1_x.weight, mlp.fc1_x.bias))
    else:
        hidden = ws.buffer("hidden", (n, H), x)[:k]
        torch.mm(y, mlp.fc1.weight.t(), out=hidden)
        torch.ops.aten.gelu_(hidden.add_(mlp.fc1.bias))
    if not isinstance(mlp.norm, nn.Identity):  # EVA-02's LayerNorm on the hidden layer
        hidden = F.layer_norm(hidden, (H,), mlp.norm.weight, mlp.norm.bias, mlp.norm.eps)
    x.add_(fc2_b).addmm_(hidden, fc2_w.t())


def _layer_scaled(ls: nn.Module, weight: torch.Tensor, bias: torch.Tensor):
    """A branch's last linear layer with its LayerScale folded in: gamma * (W y + b) =
    (gamma W) y + gamma b (exact algebra; the weights themselves are left untouched)."""
    gamma = getattr(ls, "gamma", None)
    if gamma is None:
        return weight, bias
    return weight * gamma[:, None], bias * gamma


def _query_and_output_biases(attn: nn.Module) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(b_q, b_proj + W_proj b_v): the key bias is dropped, the value bias folded."""
    bias = attn.bias()
    if bias is None:
        return None, attn.proj.bias
    b_q, _, b_v = bias.view(3, -1)
    return b_q, torch.addmv(attn.proj.bias, attn.proj.weight, b_v)


def attention_with_maps(qkv: torch.Tensor, batch: int, heads: int, ws: Workspace):
    """softmax(q k^T / sqrt(d)) v with the weights kept: qkv (N, 3D) -> ((B, h, T, d), maps).

    The maps are (B, h, T, T), each row summing to 1, as ``sdpa_attention`` returns them, and
    are the only fresh memory: one copy puts q, k and v head-major in a workspace buffer so
    both products are plain batched GEMMs, and the softmax runs in place in the scores, which
    become the returned maps.
    """
    N, D3 = qkv.shape
    T, d = N // batch, D3 // (3 * heads)
    head_major = ws.buffer("heads", (3, batch, heads, T, d), qkv)
    src = qkv.view(batch, T, 3, heads, d).permute(2, 0, 3, 1, 4)  # (3, B, h, T, d)
    torch.mul(src[0], d ** -0.5, out=head_major[0])  # q, scaled on the way
    head_major[1:].copy_(src[1:])  # k, v
    q, k, v = head_major.view(3, batch * heads, T, d).unbind(0)
    scores = torch.bmm(q, k.transpose(1, 2))  # (B*h, T, T)
    torch.ops.aten._softmax.out(scores, -1, False, out=scores)  # row-wise: safe in place
    o = torch.bmm(scores, v, out=ws.buffer("heads_out", (batch * heads, T, d), qkv))
    return o.view(batch, heads, T, d), scores.view(batch, heads, T, T)


def last_block_readout(block: nn.Module, x: torch.Tensor, batch: int, rows: int,
                       ws: Workspace, rope_table=None) -> torch.Tensor:
    """The last block for the first ``rows`` tokens only: stream (N, D) -> (B, rows, D).

    Every token still provides keys and values; only the readout rows ([CLS], distillation)
    get a query, the output projection and the MLP, which is all the head reads.
    """
    attn = block.attn
    N, D = x.shape
    T, h = N // batch, attn.num_heads
    y = F.layer_norm(x, (D,), block.norm1.weight, block.norm1.bias, block.norm1.eps)
    kv_buf = ws.buffer("qkv", (N, 3 * D), x).view(-1)[: N * 2 * D].view(N, 2 * D)
    kv = torch.mm(y, attn.qkv.weight[D:].t(), out=kv_buf)  # (N, 2D): keys, values
    if rope_table is not None:  # the readout rows are prefix rows: only the keys turn
        _rotate_(kv.view(batch, T, 2, h, D // h), attn, rope_table, (0,))
    y_read = y.view(batch, T, D)[:, :rows].reshape(batch * rows, D)
    q = torch.mm(y_read, attn.qkv.weight[:D].t())  # (B*rows, D)
    b_q, proj_bias = _query_and_output_biases(attn)
    if b_q is not None:
        q.add_(b_q)
    q = q.view(batch, rows, h, D // h).transpose(1, 2)  # (B, h, rows, d)
    k, v = kv.view(batch, T, 2, h, D // h).permute(2, 0, 3, 1, 4).unbind(0)  # (B, h, T, d)
    o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch * rows, D)
    out = x.view(batch, T, D)[:, :rows].reshape(batch * rows, D)  # a copy: the readout rows
    proj_w, proj_bias = _layer_scaled(block.ls1, attn.proj.weight, proj_bias)
    out.add_(proj_bias).addmm_(o, proj_w.t())
    _mlp_residual_(block, out, ws, N)
    return out.view(batch, rows, D)
