"""Hugging Face SigLIP image towers (``SiglipVisionModel``, or the vision half of a
``SiglipModel``): no [CLS], a patch-only position table, CLIP's block names, ``post_layernorm``
on every token and a MAP head (``head.probe`` attending through an ``nn.MultiheadAttention``,
then LayerNorm and MLP), which is vitkit's ``pool="map"``."""

from __future__ import annotations

from vitkit.checkpoints.common import Checkpoint, StateDict
from vitkit.checkpoints.hf_clip import act_of, encoder_to_vitkit, vision_config, vision_part

NAME = "hf-siglip"
LABEL = "Hugging Face SigLIP vision tower (embeddings.patch_embedding, head.probe)"


def detect(ckpt: Checkpoint) -> bool:
    return any(k.endswith("embeddings.patch_embedding.weight") for k in ckpt.state) and \
        not any(k.endswith("embeddings.class_embedding") for k in ckpt.state)


def to_vitkit(state: StateDict, config: dict | None, notes: list[str]):
    cfg = vision_config(config, "SigLIP vision model")
    state = vision_part(state, notes)
    state.pop("embeddings.position_ids", None)
    out: StateDict = {
        "patch_embed.proj.weight": state.pop("embeddings.patch_embedding.weight"),
        "patch_embed.proj.bias": state.pop("embeddings.patch_embedding.bias"),
        "pos_embed": state.pop("embeddings.position_embedding.weight")[None],
        "norm.weight": state.pop("post_layernorm.weight"),
        "norm.bias": state.pop("post_layernorm.bias"),
    }
    depth = encoder_to_vitkit(state, out)
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
    kwargs = dict(
        img_size=cfg.get("image_size", 224), patch_size=out["patch_embed.proj.weight"].shape[-1],
        in_chans=out["patch_embed.proj.weight"].shape[1], num_classes=0, embed_dim=width,
        depth=depth, num_heads=cfg.get("num_attention_heads"),
        mlp_dim=out["blocks.0.mlp.fc1.weight"].shape[0], class_token=False, pool=pool,
        act=act_of(cfg), norm_eps=cfg.get("layer_norm_eps", 1e-6),
    )
    return out, kwargs, {"mean": [0.5] * 3, "std": [0.5] * 3}
