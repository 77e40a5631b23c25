"""torchvision ``vit_b_16`` and friends: ``nn.MultiheadAttention`` blocks (``in_proj_weight`` is
vitkit's fused qkv, same q/k/v order), ``heads.head`` and an optional ``heads.pre_logits``
(Linear + tanh). The key names map one to one."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from vitkit.checkpoints.common import (
    ROPE_ERA_OPTIONS,
    Checkpoint,
    CheckpointError,
    StateDict,
    cnn_refusal,
    full_state,
    infer_grid,
    new_options_refusal,
    refuse,
)
from vitkit.checkpoints.timm import depth_of
from vitkit.checkpoints.writing import save_safetensors
from vitkit.data.images import IMAGENET_MEAN, IMAGENET_STD
from vitkit.util.files import atomic_write

NAME = "torchvision"
LABEL = "torchvision ViT (conv_proj.weight)"
DEPTH_FROM_WEIGHTS = True  # a bare file does not state its depth: blocks may be lost unseen
# The ViTConfig fields a torchvision state dict holds: what the shapes show (square images, the
# grid read back from the table), the pre-logits layer (representation_size); a missing head
# bias is written as zeros. The number of heads is not stored anywhere (torchvision's users pass
# it to the constructor): load_model infers it from the family table or is told (num_heads=).
HOLDS = frozenset({
    "img_size", "patch_size", "num_classes", "embed_dim", "depth", "mlp_dim", "representation_size",
    "head_bias",
})
UNSTORED = frozenset({"num_heads"})
REFUSES = frozenset({"pos_interp",
    "in_chans", "pool", "class_token", "distilled", "num_reg_tokens", "no_embed_class",
    "fc_norm", "qkv_bias", "init_values", "pre_norm", "patch_bias", "act", "norm_eps",
    "dynamic_img_size", "pos_antialias",
}) | ROPE_ERA_OPTIONS

_L = "encoder.layers.encoder_layer_{i}."
# (vitkit pattern, torchvision pattern); blocks use "{i}".
_RENAMES = [
    ("cls_token", "class_token"),
    ("pos_embed", "encoder.pos_embedding"),
    ("patch_embed.proj.", "conv_proj."),
    ("blocks.{i}.norm1.", _L + "ln_1."),
    ("blocks.{i}.attn.qkv.weight", _L + "self_attention.in_proj_weight"),
    ("blocks.{i}.attn.qkv.bias", _L + "self_attention.in_proj_bias"),
    ("blocks.{i}.attn.proj.", _L + "self_attention.out_proj."),
    ("blocks.{i}.norm2.", _L + "ln_2."),
    ("blocks.{i}.mlp.fc1.", _L + "mlp.0."),
    ("blocks.{i}.mlp.fc2.", _L + "mlp.3."),
    ("norm.", "encoder.ln."),
    ("pre_logits.fc.", "heads.pre_logits."),
    ("head.", "heads.head."),
]
# torchvision < 0.13 named the MLP layers linear_1 / linear_2
_LEGACY = {"mlp.linear_1.": "mlp.0.", "mlp.linear_2.": "mlp.3."}


def detect(ckpt: Checkpoint) -> bool:
    return "conv_proj.weight" in ckpt.state and "encoder.pos_embedding" in ckpt.state


def _rename(key: str, rules: list[tuple[str, str]]) -> str:
    """Rename by the first rule whose source (with ``{i}`` as a block index) is a prefix."""
    for src, dst in rules:
        pattern = "^" + re.escape(src).replace(r"\{i\}", r"(\d+)")
        if m := re.match(pattern, key):
            out = dst.replace("{i}", m.group(1)) if "{i}" in src else dst
            return out + key[m.end():]
    return key


def to_vitkit(state: StateDict, config: dict | None, notes: list[str]):
    for old, new in _LEGACY.items():
        state = {k.replace(old, new): v for k, v in state.items()}
    out = {_rename(k, [(b, a) for a, b in _RENAMES]): v for k, v in state.items()}
    w = out["patch_embed.proj.weight"]
    width, in_chans, patch = w.shape[0], w.shape[1], w.shape[2]
    depth = depth_of(out, r"blocks\.(\d+)\.")
    mlp_dim = out["blocks.0.mlp.fc1.weight"].shape[0]
    grid, has_prefix = infer_grid(out["pos_embed"].shape[1], 1, None, patch)
    if not has_prefix:
        raise CheckpointError("torchvision ViT position table without a [CLS] row")
    pre = out["pre_logits.fc.weight"].shape[0] if "pre_logits.fc.weight" in out else 0
    kwargs = dict(
        img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=in_chans,
        num_classes=out["head.weight"].shape[0] if "head.weight" in out else 0,
        embed_dim=width, depth=depth, num_heads=None,  # not stored: the loader infers it
        mlp_dim=mlp_dim, representation_size=pre, norm_eps=1e-6,
    )
    return out, kwargs, {"mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}


def refusals(cfg) -> list[str]:
    """Why torchvision's ``VisionTransformer`` cannot hold this model (empty when it can)."""
    if cnn_refusal(cfg):
        return cnn_refusal(cfg)
    return new_options_refusal(cfg) + [msg for bad, msg in [
        (cfg.pool != "cls", "pools by average (torchvision pools [CLS])"),
        (cfg.distilled, "has a distillation token"),
        (cfg.num_reg_tokens > 0, "has register tokens"),
        (cfg.no_embed_class, "has no position row for [CLS]"),
        (cfg.img_size[0] != cfg.img_size[1],
         f"takes rectangular {cfg.img_size[0]}x{cfg.img_size[1]} images (torchvision stores "
         "one image_size)"),
        (not cfg.qkv_bias, "has no qkv bias (nn.MultiheadAttention always has one)"),
        (cfg.norm_eps != 1e-6, f"uses LayerNorm eps {cfg.norm_eps:g} (torchvision fixes 1e-6)"),
        (cfg.in_chans != 3,
         f"takes {cfg.in_chans}-channel images (torchvision's ViT takes 3 channels)"),
        (cfg.dynamic_img_size or cfg.pos_antialias,
         "interpolates its position table to each input size (dynamic_img_size, "
         "pos_antialias; torchvision's ViT takes one size)"),
    ] if bad]


def write(model, dst: Path) -> Path:
    """A ``.pth`` (or ``.safetensors``) state dict for ``torchvision.models.VisionTransformer``."""
    state, _ = from_vitkit(model)
    if dst.suffix == ".safetensors":
        return save_safetensors(state, dst, {"format": "pt"})
    return atomic_write(dst, lambda tmp: torch.save(state, tmp))


def from_vitkit(model) -> tuple[StateDict, dict]:
    cfg = model.cfg
    refuse("torchvision", refusals(cfg), "Export with --to timm or vitkit.")
    state = {_rename(k, _RENAMES): v for k, v in full_state(model).items()}
    args = dict(image_size=cfg.img_size[0], patch_size=cfg.patch_size, num_layers=cfg.depth,
                num_heads=cfg.num_heads, hidden_dim=cfg.embed_dim, mlp_dim=cfg.mlp_dim,
                num_classes=cfg.num_classes, representation_size=cfg.representation_size or None)
    return state, args
