"""Hugging Face CLIP image towers (``CLIPVisionModel``, ``CLIPVisionModelWithProjection``, or the
vision half of a ``CLIPModel``): a [CLS] ``class_embedding``, a patch embedding without bias,
``pre_layrnorm`` before the blocks, separate q/k/v projections, ``post_layernorm`` on the pooled
token, and ``visual_projection`` (no bias) as the head. The text tower is ignored, and said so.

``encoder_to_vitkit`` is shared with SigLIP, whose blocks are named the same.
"""

from __future__ import annotations

import torch

from vitkit.checkpoints.common import (
    Checkpoint,
    CheckpointError,
    StateDict,
    cnn_refusal,
    strip_prefix,
)
from vitkit.checkpoints.hf_common import HF_ACT, act_of, interpolation, interpolation_of
from vitkit.checkpoints.timm import depth_of

NAME = "hf-clip"
LABEL = "Hugging Face CLIP vision tower (vision_model.embeddings.class_embedding)"
_BLOCK = {"layer_norm1": "norm1", "self_attn.out_proj": "attn.proj", "layer_norm2": "norm2",
          "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}


def detect(ckpt: Checkpoint) -> bool:
    return any(k.endswith("embeddings.class_embedding") for k in ckpt.state) and \
        any("embeddings.patch_embedding.weight" in k for k in ckpt.state)


def vision_part(state: StateDict, notes: list[str]) -> StateDict:
    """The vision tower's tensors, prefixes removed; a text tower is dropped and noted."""
    text = [k for k in state if k.startswith(("text_model.", "text_projection", "logit_"))]
    if text:
        notes.append(f"a full image-text checkpoint: the text tower ({len(text)} tensors) is "
                     "ignored, the image tower loaded")
    state = {k: v for k, v in state.items() if k not in set(text)}
    return strip_prefix(state, "vision_model.")


def encoder_to_vitkit(state: StateDict, out: StateDict, stated: int | None = None) -> int:
    """Move ``encoder.layers.N.*`` (q/k/v fused into qkv) into ``out``; returns the depth
    (``stated``: the config's ``num_hidden_layers``, checked against the blocks present)."""
    depth = depth_of(state, r"encoder\.layers\.(\d+)\.", stated)
    for i in range(depth):
        hf = f"encoder.layers.{i}."
        for part in ("weight", "bias"):
            qkv = [state.pop(f"{hf}self_attn.{n}_proj.{part}", None) for n in "qkv"]
            if all(t is not None for t in qkv):
                out[f"blocks.{i}.attn.qkv.{part}"] = torch.cat(qkv, 0)
            for theirs, ours in _BLOCK.items():
                if f"{hf}{theirs}.{part}" in state:
                    out[f"blocks.{i}.{ours}.{part}"] = state.pop(f"{hf}{theirs}.{part}")
    return depth


def vision_config(config: dict | None, what: str) -> dict:
    if not config:
        raise CheckpointError(f"a Hugging Face {what} needs its config.json beside the weights "
                              "(load the folder save_pretrained wrote, not the bare file)")
    return config.get("vision_config") or config


def to_vitkit(state: StateDict, config: dict | None, notes: list[str]):
    cfg = vision_config(config, "CLIP vision model")
    state = vision_part(state, notes)
    projection = state.pop("visual_projection.weight", None)
    out: StateDict = {
        "cls_token": state.pop("embeddings.class_embedding").reshape(1, 1, -1),
        "patch_embed.proj.weight": state.pop("embeddings.patch_embedding.weight"),
        "pos_embed": state.pop("embeddings.position_embedding.weight")[None],
        "norm_pre.weight": state.pop("pre_layrnorm.weight"),
        "norm_pre.bias": state.pop("pre_layrnorm.bias"),
        "norm.weight": state.pop("post_layernorm.weight"),
        "norm.bias": state.pop("post_layernorm.bias"),
    }
    state.pop("embeddings.position_ids", None)  # a buffer of older checkpoints
    depth = encoder_to_vitkit(state, out, cfg.get("num_hidden_layers"))
    if projection is not None:
        out["head.weight"] = projection
    out.update(state)  # anything left is reported as unexpected by the strict load
    patch = out["patch_embed.proj.weight"].shape[-1]
    side = cfg.get("image_size", 224)
    width = out["cls_token"].shape[-1]
    kwargs = dict(
        img_size=side, patch_size=patch, in_chans=out["patch_embed.proj.weight"].shape[1],
        num_classes=projection.shape[0] if projection is not None else 0,
        embed_dim=width, depth=depth, num_heads=cfg.get("num_attention_heads"),
        mlp_dim=out["blocks.0.mlp.fc1.weight"].shape[0], pre_norm=True, patch_bias=False,
        head_bias=False, act=act_of(cfg), norm_eps=cfg.get("layer_norm_eps", 1e-5),
        **interpolation_of(cfg),
    )
    extra = {"mean": [0.48145466, 0.4578275, 0.40821073],  # CLIP's normalisation
             "std": [0.26862954, 0.26130258, 0.27577711]}
    return out, kwargs, extra


def tower_refusals(cfg) -> list[str]:
    """What no Hugging Face vision tower holds: a missing qkv bias, rectangular inputs."""
    return [msg for bad, msg in [
        (not cfg.qkv_bias, "has no qkv bias"),
        (cfg.img_size[0] != cfg.img_size[1], "takes rectangular images"),
    ] if bad]


def refusals(cfg) -> list[str]:
    """Why ``CLIPVisionModelWithProjection`` cannot hold this model."""
    return cnn_refusal(cfg) or [msg for bad, msg in [
        (not cfg.pre_norm, "has no LayerNorm before the blocks (use the Hugging Face ViT "
                           "layout)"),
        (cfg.pool != "cls" or cfg.distilled or cfg.num_reg_tokens, "is not pooled by one "
                                                                    "[CLS] token"),
        (cfg.no_embed_class, "has no position row for [CLS]"),
        (cfg.patch_bias, "has a patch-embedding bias"),
        (cfg.num_classes and cfg.head_bias, "has a head with a bias (CLIP's projection has "
                                            "none)"),
        (cfg.init_values is not None, "has LayerScale"),
        (cfg.representation_size,
         "has a pre-logits layer (CLIP projects the [CLS] token directly)"),
    ] if bad] + tower_refusals(cfg)


def from_vitkit(model) -> tuple[StateDict, dict]:
    """vitkit model -> (state dict, config.json) of ``CLIPVisionModelWithProjection``."""
    cfg = model.cfg
    s = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    out: StateDict = {
        "vision_model.embeddings.class_embedding": s["cls_token"].reshape(-1),
        "vision_model.embeddings.patch_embedding.weight": s["patch_embed.proj.weight"],
        "vision_model.embeddings.position_embedding.weight": s["pos_embed"][0],
        "vision_model.pre_layrnorm.weight": s["norm_pre.weight"],
        "vision_model.pre_layrnorm.bias": s["norm_pre.bias"],
        "vision_model.post_layernorm.weight": s["norm.weight"],
        "vision_model.post_layernorm.bias": s["norm.bias"],
    }
    out.update(encoder_from_vitkit(s, cfg.depth, "vision_model."))
    if cfg.num_classes:
        out["visual_projection.weight"] = s["head.weight"]
    config = {"architectures": ["CLIPVisionModelWithProjection"],
              "model_type": "clip_vision_model", **tower_config(cfg),
              "projection_dim": cfg.num_classes or cfg.embed_dim}
    return out, config


def tower_config(cfg) -> dict:
    """The ``config.json`` fields every Hugging Face vision tower (CLIP, SigLIP) shares."""
    return {"hidden_size": cfg.embed_dim, "num_hidden_layers": cfg.depth,
            "num_attention_heads": cfg.num_heads, "intermediate_size": cfg.mlp_dim,
            "image_size": cfg.img_size[0], "patch_size": cfg.patch_size,
            "num_channels": cfg.in_chans, "layer_norm_eps": cfg.norm_eps,
            "hidden_act": HF_ACT[cfg.act], **interpolation(cfg)}


def encoder_from_vitkit(s: StateDict, depth: int, prefix: str) -> StateDict:
    """vitkit blocks -> ``encoder.layers.N.*`` (qkv split into q/k/v projections)."""
    out: StateDict = {}
    for i in range(depth):
        hf, o = f"{prefix}encoder.layers.{i}.", f"blocks.{i}."
        for part in ("weight", "bias"):
            for n, t in zip("qkv", s[f"{o}attn.qkv.{part}"].chunk(3), strict=True):
                out[f"{hf}self_attn.{n}_proj.{part}"] = t.contiguous()
            for theirs, ours in _BLOCK.items():
                out[f"{hf}{theirs}.{part}"] = s[f"{o}{ours}.{part}"]
    return out
