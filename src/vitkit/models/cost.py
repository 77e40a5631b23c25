"""What a ViT costs: parameters by part, counted from the module, and FLOPs per image.

The FLOP model counts multiply-adds (MACs) of the matrix products, FLOPs = 2 x MACs, for one
image with N patches and T = N + prefix tokens:

    patch embedding   N * D * C * P^2
    per block linear  T * (3D^2 + D^2 + 2 D Dm)      qkv, output projection, MLP  (~12 T D^2)
    per block attn    2 * T^2 * D                     q k^T and attn @ v
    head              D * num_classes, plus a MAP head's query, keys/values, attention and MLP

LayerNorm, softmax, GELU and the residual adds are elementwise (O(T D)) and left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from vitkit.models.cnn import is_cnn
from vitkit.models.vit import ViTConfig


def _count(module: nn.Module | nn.Parameter | None) -> int:
    if module is None:
        return 0
    if isinstance(module, nn.Parameter):
        return module.numel()
    return sum(p.numel() for p in module.parameters())


def param_breakdown(model) -> dict[str, int]:
    """Parameters by part of a :class:`VisionTransformer`, counted from its tensors.

    Keys: patch_embed, pos_embed, rope, tokens ([CLS], distillation, registers), block.attn,
    block.mlp, block.norms, block.layerscale (one block), blocks (all), norm (the LayerNorms
    outside the blocks: before them (CLIP), and the final one before or after pooling),
    attn_pool (a MAP head), head (with a pre-logits layer and a distillation head if present),
    total.
    """
    block = model.blocks[0]
    parts = {
        "patch_embed": _count(model.patch_embed),
        "pos_embed": _count(model.pos_embed),
        "tokens": sum(_count(t) for t in (model.cls_token, model.dist_token, model.reg_token)),
        "block.attn": _count(block.attn),
        "block.mlp": _count(block.mlp),
        "block.norms": _count(block.norm1) + _count(block.norm2),
        "block.layerscale": _count(block.ls1) + _count(block.ls2),
        "blocks": _count(model.blocks),
        "norm": _count(model.norm) + _count(model.fc_norm) + _count(model.norm_pre),
        "attn_pool": _count(model.attn_pool),
        "rope": _count(model.rope),  # RoPE-Mixed's learned frequencies; 0 for fixed ones
        "head": _count(model.head) + _count(model.head_dist) + _count(model.pre_logits),
    }
    parts["total"] = _count(model)
    return parts


@dataclass(frozen=True)
class Cost:
    """Multiply-adds for one image, by term (see the module docstring)."""

    patches: int  # N
    tokens: int  # T = N + prefix tokens
    patch_embed: int
    linear: int  # all blocks, the ~12 T D^2 terms
    attention: int  # all blocks, the 2 T^2 D terms
    head: int

    @property
    def macs(self) -> int:
        return self.patch_embed + self.linear + self.attention + self.head

    @property
    def flops(self) -> int:
        return 2 * self.macs


def flop_model(cfg: ViTConfig, readout_only: bool = False) -> Cost:
    """Cost per image of the architecture ``cfg`` at its ``img_size``.

    ``readout_only``: what ``model(x)`` computes for a [CLS]-pooled model, whose last block
    skips the query, attention output, projection and MLP of every row the head does not read
    (keys and values still come from all T tokens). Ignored for average pooling.
    """
    gh, gw = cfg.grid_size
    n = gh * gw
    t = n + cfg.num_prefix_tokens
    d, dm = cfg.embed_dim, cfg.mlp_dim
    mlp = (3 if cfg.mlp != "gelu" else 2) * d * dm  # SwiGLU: a gate, a value, an output layer
    rows = cfg.readout_rows
    skipped = t - len(rows) if readout_only and rows is not None else 0
    return Cost(
        patches=n,
        tokens=t,
        patch_embed=n * d * cfg.in_chans * cfg.patch_size**2,
        linear=cfg.depth * t * (4 * d * d + mlp) - skipped * (2 * d * d + mlp),
        attention=cfg.depth * 2 * t * t * d - skipped * 2 * t * d,
        head=(cfg.representation_size * (d + cfg.num_classes) if cfg.representation_size
              else d * cfg.num_classes)
        * (2 if cfg.distilled else 1)
        + (2 * d * d + 2 * t * d * d + 2 * t * d + 2 * d * dm if cfg.pool == "map" else 0),
    )


def flops_per_image(model, img_size: int) -> int:
    """FLOPs per image of a forward: the FLOP model for a ViT (whose last block computes its
    readout rows only), torch's FLOP counter for a CNN."""
    if not is_cnn(model):
        return flop_model(model.cfg, readout_only=True).flops
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.zeros(1, 3, img_size, img_size))
    return counter.get_total_flops()
