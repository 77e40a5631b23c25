"""Hugging Face SigLIP image towers (``SiglipVisionModel``, or the vision half of a
``SiglipModel``): no [CLS], a patch-only position table, CLIP's block names, ``post_layernorm``
on every token and a MAP head (``head.probe`` attending through an ``nn.MultiheadAttention``,
then LayerNorm and MLP), which is vitkit's ``pool="map"``."""

from __future__ import annotations

import math

import torch

from vitkit.checkpoints.common import Checkpoint, CheckpointError, StateDict, cnn_refusal
from vitkit.checkpoints.hf_clip import (
    encoder_from_vitkit,
    encoder_to_vitkit,
    tower_config,
    tower_refusals,
    vision_config,
    vision_part,
)
from vitkit.checkpoints.hf_common import act_of, interpolation_of

NAME = "hf-siglip"
LABEL = "Hugging Face SigLIP vision tower (embeddings.patch_embedding, head.probe)"


def detect(ckpt: Checkpoint) -> bool:
    return any(k.endswith("embeddings.patch_embedding.weight") for k in ckpt.state) and \
        not any(k.endswith("embeddings.class_embedding") for k in ckpt.state)


def to_vitkit(state: StateDict, config: dict | None, notes: list[str]):
    cfg = vision_config(config, "SigLIP vision model")
    state = vision_part(state, notes)
    state.pop("embeddings.position_ids", None)
    patch_w = state.pop("embeddings.patch_embedding.weight")
    naflex = patch_w.dim() == 2  # SigLIP 2: a linear map of (P, P, C)-flattened patches
    if naflex:
        P, C = cfg.get("patch_size", 16), cfg.get("num_channels", 3)
        if patch_w.shape[1] != P * P * C:
            raise CheckpointError(
                f"this SigLIP 2 patch embedding takes {patch_w.shape[1]} values a patch, but its "
                f"config says {P}x{P} patches of {C} channels ({P * P * C})")
        patch_w = patch_w.reshape(-1, P, P, C).permute(0, 3, 1, 2).contiguous()
    out: StateDict = {
        "patch_embed.proj.weight": patch_w,
        "patch_embed.proj.bias": state.pop("embeddings.patch_embedding.bias"),
        "pos_embed": state.pop("embeddings.position_embedding.weight")[None],
        "norm.weight": state.pop("post_layernorm.weight"),
        "norm.bias": state.pop("post_layernorm.bias"),
    }
    depth = encoder_to_vitkit(state, out, cfg.get("num_hidden_layers"))
    width = out["patch_embed.proj.weight"].shape[0]
    pool = "avg"
    if "head.probe" in state:
        pool = "map"
        w, b = state.pop("head.attention.in_proj_weight"), state.pop("head.attention.in_proj_bias")
        out.update({
            "attn_pool.latent": state.pop("head.probe"),
            "attn_pool.q.weight": w[:width], "attn_pool.q.bias": b[:width],
            "attn_pool.kv.weight": w[width:], "attn_pool.kv.bias": b[width:],
            "attn_pool.proj.weight": state.pop("head.attention.out_proj.weight"),
            "attn_pool.proj.bias": state.pop("head.attention.out_proj.bias"),
        })
        for theirs, ours in (("head.layernorm", "attn_pool.norm"),
                             ("head.mlp.fc1", "attn_pool.mlp.fc1"),
                             ("head.mlp.fc2", "attn_pool.mlp.fc2")):
            for part in ("weight", "bias"):
                out[f"{ours}.{part}"] = state.pop(f"{theirs}.{part}")
    out.update(state)
    patch = out["patch_embed.proj.weight"].shape[-1]
    img = cfg.get("image_size", 224)
    if naflex:  # the table is a square grid of num_patches, moved to each image's own grid
        side = math.isqrt(out["pos_embed"].shape[1])
        if side * side != out["pos_embed"].shape[1]:
            raise CheckpointError(f"this SigLIP 2 position table has {out['pos_embed'].shape[1]} "
                                  "rows, not a square grid")
        img = side * patch
        notes.append("SigLIP 2 (NaFlex): the table is moved to each image's own patch grid "
                     "(bilinear, antialiased), so an image keeps its aspect ratio")
    kwargs = dict(
        img_size=img, patch_size=patch,
        in_chans=out["patch_embed.proj.weight"].shape[1], num_classes=0, embed_dim=width,
        depth=depth, num_heads=cfg.get("num_attention_heads"),
        mlp_dim=out["blocks.0.mlp.fc1.weight"].shape[0], class_token=False, pool=pool,
        act=act_of(cfg), norm_eps=cfg.get("layer_norm_eps", 1e-6),
        **(dict(dynamic_img_size=True, pos_antialias=True, pos_interp="bilinear") if naflex
           else interpolation_of(cfg)),
    )
    return out, kwargs, {"mean": [0.5] * 3, "std": [0.5] * 3}


def refusals(cfg) -> list[str]:
    """Why ``SiglipVisionModel`` (or, for a table moved bilinearly, ``Siglip2VisionModel``)
    cannot hold this model."""
    return cnn_refusal(cfg) or [msg for bad, msg in [
        (cfg.pos_interp == "bilinear" and not (cfg.dynamic_img_size and cfg.pos_antialias),
         "moves its table bilinearly but not to every input with antialias (SigLIP 2's "
         "NaFlex does both)"),
        (cfg.pool != "map", "does not pool by attention (a MAP head)"),
        (cfg.class_token or cfg.num_reg_tokens, "has prefix tokens"),
        (cfg.num_classes > 0, "has a head (SiglipVisionModel ends at the MAP head)"),
        (cfg.init_values is not None or cfg.pre_norm or not cfg.patch_bias,
         "has LayerScale or CLIP options"),
        (cfg.representation_size,
         "has a pre-logits layer (SiglipVisionModel ends at the MAP head)"),
    ] if bad] + tower_refusals(cfg)


def from_vitkit(model) -> tuple[StateDict, dict]:
    """vitkit model -> (state dict, config.json) of ``SiglipVisionModel``."""
    cfg = model.cfg
    s = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    p = "vision_model."
    patch_w = s["patch_embed.proj.weight"]  # (D, C, P, P)
    if cfg.pos_interp == "bilinear":  # SigLIP 2: a linear map of (P, P, C)-flattened patches
        patch_w = patch_w.permute(0, 2, 3, 1).reshape(patch_w.shape[0], -1).contiguous()
    out: StateDict = {
        f"{p}embeddings.patch_embedding.weight": patch_w,
        f"{p}embeddings.patch_embedding.bias": s["patch_embed.proj.bias"],
        f"{p}embeddings.position_embedding.weight": s["pos_embed"][0],
        f"{p}post_layernorm.weight": s["norm.weight"], f"{p}post_layernorm.bias": s["norm.bias"],
        f"{p}head.probe": s["attn_pool.latent"],
        f"{p}head.attention.in_proj_weight": torch.cat([s["attn_pool.q.weight"],
                                                        s["attn_pool.kv.weight"]]),
        f"{p}head.attention.in_proj_bias": torch.cat([s["attn_pool.q.bias"],
                                                      s["attn_pool.kv.bias"]]),
        f"{p}head.attention.out_proj.weight": s["attn_pool.proj.weight"],
        f"{p}head.attention.out_proj.bias": s["attn_pool.proj.bias"],
    }
    for theirs, ours in (("head.layernorm", "attn_pool.norm"), ("head.mlp.fc1",
                         "attn_pool.mlp.fc1"), ("head.mlp.fc2", "attn_pool.mlp.fc2")):
        for part in ("weight", "bias"):
            out[f"{p}{theirs}.{part}"] = s[f"{ours}.{part}"]
    out.update(encoder_from_vitkit(s, cfg.depth, p))
    config = {"architectures": ["SiglipVisionModel"], "model_type": "siglip_vision_model",
              **tower_config(cfg)}
    if cfg.pos_interp == "bilinear":
        gh, gw = cfg.grid_size
        config.update(architectures=["Siglip2VisionModel"], model_type="siglip2_vision_model",
                      num_patches=gh * gw)
    return out, config
