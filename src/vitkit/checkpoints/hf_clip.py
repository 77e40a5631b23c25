"""Hugging Face CLIP image towers (``CLIPVisionModel``, ``CLIPVisionModelWithProjection``, or the
vision half of a ``CLIPModel``): a [CLS] ``class_embedding``, a patch embedding without bias,
``pre_layrnorm`` before the blocks, separate q/k/v projections, ``post_layernorm`` on the pooled
token, and ``visual_projection`` (no bias) as the head. The text tower is ignored, and said so.

``encoder_to_vitkit`` is shared with SigLIP, whose blocks are named the same.
"""

from __future__ import annotations

import torch

from vitkit.checkpoints.common import Checkpoint, CheckpointError, StateDict, strip_prefix
from vitkit.checkpoints.timm import depth_of

NAME = "hf-clip"
LABEL = "Hugging Face CLIP vision tower (vision_model.embeddings.class_embedding)"
# Hugging Face's hidden_act names -> vitkit's act
ACTS = {"quick_gelu": "quick_gelu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
        "gelu_new": "gelu_tanh"}
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


def encoder_to_vitkit(state: StateDict, out: StateDict) -> int:
    """Move ``encoder.layers.N.*`` (q/k/v fused into qkv) into ``out``; returns the depth."""
    depth = depth_of(state, r"encoder\.layers\.(\d+)\.")
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


def act_of(config: dict) -> str:
    act = ACTS.get(config.get("hidden_act", "gelu"))
    if act is None:
        raise CheckpointError(f"hidden_act {config['hidden_act']!r} is not supported; vitkit "
                              f"reads {', '.join(ACTS)}")
    return act


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
    depth = encoder_to_vitkit(state, out)
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
    )
    extra = {"mean": [0.48145466, 0.4578275, 0.40821073],  # CLIP's normalisation
             "std": [0.26862954, 0.26130258, 0.27577711]}
    return out, kwargs, extra
