"""timm's ``Eva`` layout (models/eva.py): EVA-02, DINOv3, Perception Encoder and the RoPE ViTs.

Its keys are timm's ViT keys but for four things, each mapped exactly:
- LayerScale is ``blocks.N.gamma_1`` / ``gamma_2`` (vitkit: ``ls1.gamma`` / ``ls2.gamma``);
- a query and value bias without a key bias is ``attn.q_bias`` / ``attn.v_bias`` beside a
  bias-free ``attn.qkv`` (vitkit's ``key_bias=False`` keeps those names);
- EVA-02 B/L split the projection into ``attn.q_proj`` / ``k_proj`` / ``v_proj`` (fused here);
- the rotary embeddings are computed, not stored (but RoPE-Mixed's learned ``rope.freqs``).

What the weights do not say (which rotary variant, its base, offset and axes, and the LayerNorm
eps) comes from the architecture's entry in vitkit's family table, or from the ``model_args``
of a config.json vitkit wrote. A bare state dict of this layout is refused: the same keys
serve several rotary variants, and post-norm blocks have the pre-norm blocks' keys.
"""

from __future__ import annotations

import re

import torch

from vitkit.checkpoints.common import StateDict, rope_era_refusal
from vitkit.models.registry import MODEL_ARGS

# timm Eva arguments (config.json model_args) that change the forward in a way vitkit's ViT
# cannot express, with what each is; a true value is refused by name
_INEXPRESSIBLE_ARGS = {
    "use_post_norm": "post-norm blocks (EVA-02 enormous, EVA giant CLIP)",
    "qk_norm": "query/key normalisation (QK-norm)",
    "scale_attn_inner": "a LayerNorm inside attention (EVA-02 CLIP's scale_attn_inner)",
    "gated_attn": "gated attention",
    "num_kv_heads": "grouped-query attention",
    "attn_only_layer_scale": "LayerScale on the attention branch only",
    "dynamic_img_pad": "dynamic image padding",
    "rope_mrope_section": "multimodal RoPE (MRoPE)",
}


def is_eva(state: StateDict) -> bool:
    """Whether ``state`` has a key of timm's Eva layout (or none of the absolute table)."""
    return "pos_embed" not in state or any(
        k.endswith((".gamma_1", ".attn.q_bias", ".attn.q_proj.weight")) or k == "rope.freqs"
        for k in state)


def unsupported(state: StateDict, config: dict) -> list[str]:
    """What an Eva-layout checkpoint has that vitkit cannot express (empty when none)."""
    keys = list(state)
    found = [what for name, what in _INEXPRESSIBLE_ARGS.items()
             if (config.get("model_args") or {}).get(name)]
    if (config.get("model_args") or {}).get("rope_type") == "mrope":
        found.append("multimodal RoPE (MRoPE)")
    if any(re.match(r"blocks\.\d+\.attn\.norm\.", k) for k in keys):
        found.append(_INEXPRESSIBLE_ARGS["scale_attn_inner"])
    if any(k.endswith("attn.gate.weight") for k in keys):
        found.append(_INEXPRESSIBLE_ARGS["gated_attn"])
    k_proj, q_proj = state.get("blocks.0.attn.k_proj.weight"), state.get(
        "blocks.0.attn.q_proj.weight")
    if k_proj is not None and q_proj is not None and k_proj.shape != q_proj.shape:
        found.append(_INEXPRESSIBLE_ARGS["num_kv_heads"])
    if "blocks.0.gamma_1" in state and "blocks.0.gamma_2" not in state:
        found.append(_INEXPRESSIBLE_ARGS["attn_only_layer_scale"])
    if "norm.weight" not in state and "fc_norm.weight" not in state:
        found.append("no LayerNorm after the blocks (Perception Encoder lang/spatial)")
    return list(dict.fromkeys(found))


def to_vitkit_keys(state: StateDict) -> StateDict:
    """Eva keys -> vitkit keys (same tensors; split projections concatenated)."""
    out: StateDict = {}
    for k, v in state.items():
        m = re.match(r"(blocks\.\d+\.)(gamma_[12])$", k)
        if m:
            out[f"{m.group(1)}ls{m.group(2)[-1]}.gamma"] = v
            continue
        m = re.match(r"(blocks\.\d+\.attn\.)([qkv])_proj\.(weight|bias)$", k)
        if m:
            block, part, kind = m.groups()
            if kind == "weight" and part == "q":
                out[block + "qkv.weight"] = torch.cat(
                    [state[f"{block}{p}_proj.weight"] for p in "qkv"])
            elif kind == "bias" and part in "qv":
                out[f"{block}{part}_bias"] = v
            elif kind == "bias":  # a key bias: the three biases as one
                out[block + "qkv.bias"] = v
            continue
        out[k] = v
    # a projection with biases for all three (never written by timm's Eva, but expressible)
    for k in [k for k in out if k.endswith("attn.qkv.bias") and k.replace(
            "qkv.bias", "q_bias") in out]:
        block = k[: -len("qkv.bias")]
        out[k] = torch.cat([out.pop(block + "q_bias"), out[k], out.pop(block + "v_bias")])
    return out


def from_vitkit_keys(state: StateDict) -> StateDict:
    """vitkit keys -> Eva keys (LayerScale renamed; everything else as it is)."""
    out: StateDict = {}
    for k, v in state.items():
        m = re.match(r"(blocks\.\d+\.)ls([12])\.gamma$", k)
        out[f"{m.group(1)}gamma_{m.group(2)}" if m else k] = v
    return out


def kwargs_of(family: dict, state: StateDict) -> dict:
    """The ViTConfig fields of an Eva checkpoint that its weights do not fix: the rotary variant
    and its settings, from ``family`` (a family table entry or vitkit's own config entries)."""
    names = ("rope", "rope_temperature", "rope_offset", "rope_xy", "rope_half",
             "rope_ref_grid", "pool_heads")
    out = {n: family[n] for n in names if n in family}
    out["abs_pos"] = "pos_embed" in state
    swiglu = "blocks.0.mlp.fc1_g.weight" in state
    fc1, fc2 = state.get("blocks.0.mlp.fc1.weight"), state["blocks.0.mlp.fc2.weight"]
    out["mlp"] = "swiglu" if swiglu else (
        "glu" if fc1 is not None and fc1.shape[0] == 2 * fc2.shape[1] else "gelu")
    out["mlp_norm"] = "blocks.0.mlp.norm.weight" in state
    out["key_bias"] = "blocks.0.attn.q_bias" not in state
    return out


def model_args(cfg) -> dict:
    """timm ``Eva`` constructor arguments for ``cfg`` (every one that matters, so that the
    architecture named beside them adds nothing of its own but the LayerNorm eps)."""
    rope_type = {"axial": "cat", "dinov3": "dinov3", "mixed": "mixed"}.get(cfg.rope)
    glu = cfg.mlp != "gelu"
    return dict(
        img_size=list(cfg.img_size), patch_size=cfg.patch_size, in_chans=cfg.in_chans,
        embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads,
        # Eva's hidden width is int(D * ratio): a ratio a hair above keeps it exact
        mlp_ratio=(cfg.mlp_dim + 0.5) / cfg.embed_dim,
        qkv_bias=cfg.qkv_bias, qkv_fused=True,
        # a full qkv bias is AttentionRope's (EvaAttention has none on the key)
        attn_type="eva" if not (cfg.qkv_bias and cfg.key_bias) else "rope",
        swiglu_mlp=glu, scale_mlp=cfg.mlp_norm,
        # the split SwiGLU unless packed and without the hidden LayerNorm (Eva's own rule)
        swiglu_align_to=1 if cfg.mlp == "swiglu" and not cfg.mlp_norm else 0,
        class_token=cfg.class_token, num_reg_tokens=cfg.num_reg_tokens,
        no_embed_class=cfg.no_embed_class, use_abs_pos_emb=cfg.abs_pos,
        use_rot_pos_emb=bool(cfg.rope), rope_type=rope_type or "cat",
        rope_temperature=cfg.rope_temperature, rope_grid_offset=cfg.rope_offset,
        rope_grid_indexing="xy" if cfg.rope_xy else "ij", rope_rotate_half=cfg.rope_half,
        ref_feat_shape=list(cfg.rope_ref_grid) if cfg.rope_ref_grid else None,
        global_pool={"cls": "token", "avg": "avg", "map": "map"}[cfg.pool],
        use_fc_norm=cfg.fc_norm, use_post_transformer_norm=not cfg.fc_norm,
        use_pre_transformer_norm=cfg.pre_norm, init_values=cfg.init_values,
        attn_pool_num_heads=cfg.pool_heads or None,
        attn_pool_mlp_ratio=(cfg.mlp_dim + 0.5) / cfg.embed_dim,
        dynamic_img_size=cfg.dynamic_img_size,
    )


def refusals(cfg) -> list[str]:
    """Why timm's ``Eva`` cannot hold this model (empty when it can)."""
    return [msg for bad, msg in [
        (cfg.act != "gelu", f"uses {cfg.act} (timm's Eva has exact GELU only)"),
        (cfg.pre_norm and cfg.patch_bias,
         "has a patch-embedding bias and a LayerNorm before the blocks (timm's Eva has no patch "
         "bias beside that LayerNorm)"),
        (cfg.distilled, "has a distillation token"),
        (cfg.representation_size, "has a pre-logits layer"),
        (cfg.rope == "dinov3" and cfg.rope_ref_grid, "rescales DINOv3's RoPE to a grid"),
        (cfg.rope == "mixed" and (cfg.rope_offset or cfg.rope_ref_grid),
         "offsets or rescales RoPE-Mixed's coordinates"),
        (cfg.norm_eps not in EPS_ARCH, f"uses LayerNorm eps {cfg.norm_eps:g} (timm's Eva names "
         "give 1e-6 or 1e-5)"),
    ] if bad]


# the timm architecture written for each LayerNorm eps (model_args override all else)
EPS_ARCH = {1e-6: "eva02_tiny_patch14_224", 1e-5: "vit_small_patch16_dinov3"}


def needs(cfg) -> bool:
    """Whether ``cfg`` sets an option only timm's Eva (not its VisionTransformer) holds."""
    return bool(rope_era_refusal(cfg))


def architecture(cfg) -> str:
    """The timm name written for ``cfg``: its own when that is an Eva model of the same LayerNorm
    eps, else the Eva name of that eps (the model_args say everything else)."""
    name = cfg.extra.get("name")
    args = MODEL_ARGS.get(name)
    if args and needs(type(cfg)(**args)) and args.get("norm_eps", 1e-6) == cfg.norm_eps:
        return name
    return EPS_ARCH[cfg.norm_eps]
