"""timm ViT state dicts and hub folders. vitkit's parameter names are timm's, so the keys map
one to one; what the weights do not say (heads, pooling, eps, resolution) comes from a
``config.json`` when there is one, else from the family table."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from vitkit.checkpoints import timm_eva
from vitkit.checkpoints.common import (
    Checkpoint,
    CheckpointError,
    StateDict,
    bilinear_refusal,
    cnn_refusal,
    full_state,
    infer_grid,
    refuse,
)
from vitkit.checkpoints.writing import save_json, save_safetensors
from vitkit.errors import MissingBlocks
from vitkit.models.registry import MODEL_ARGS
from vitkit.util.files import atomic_write

NAME = "timm"
LABEL = "timm/DeiT (patch_embed.proj.weight)"
DEPTH_FROM_WEIGHTS = True  # a bare file does not state its depth: blocks may be lost unseen
# The ViTConfig fields the hub-style folder (config.json + model.safetensors) holds: the keys
# and timm's model_args, plus norm_eps and pos_antialias as vitkit's own config entries. A
# missing patch or head bias is written as zeros (timm always has one, except the patch bias
# of a pre-norm ViT). A bare state dict (.pth, .safetensors) holds the weights only: what they
# do not show (heads, act, eps, pooling of a [CLS] model by average, a rectangular grid,
# interpolation) is read back from the family table or the defaults.
HOLDS = frozenset({
    "img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads",
    "mlp_dim", "pool", "class_token", "distilled", "num_reg_tokens", "no_embed_class",
    "fc_norm", "qkv_bias", "init_values", "pre_norm", "patch_bias", "act", "head_bias",
    "norm_eps", "dynamic_img_size", "pos_antialias", "abs_pos", "rope", "rope_temperature",
    "rope_offset", "rope_xy", "rope_half", "rope_ref_grid", "mlp", "mlp_norm", "key_bias",
    "pool_heads",
})  # the 2025-26 options in timm's Eva layout (checkpoints/timm_eva.py)
# timm has no pre-logits layer and moves a table bicubic only
REFUSES = frozenset({"pos_interp", "representation_size"})


def detect(ckpt: Checkpoint) -> bool:
    return "patch_embed.proj.weight" in ckpt.state


def depth_of(state: StateDict, pattern: str, stated: int | None = None) -> int:
    """Number of blocks: one more than the largest index matched by ``pattern``'s group.

    A gap in the indices, or fewer blocks than ``stated`` (the depth the checkpoint's config
    gives), is a :class:`MissingBlocks` error: inferring the depth from what is there would
    load a shallower model than the one that was saved, with every key matched.
    """
    indices = {int(m.group(1)) for k in state if (m := re.match(pattern, k))}
    if not indices:
        raise CheckpointError(f"no transformer blocks found (no key matches {pattern!r})")
    depth = max(max(indices) + 1, int(stated or 0))
    missing = sorted(set(range(depth)) - indices)
    if missing:
        shown = ", ".join(map(str, missing[:12])) + (" ..." if len(missing) > 12 else "")
        why = (f"its config says {stated} blocks" if stated and stated > max(indices) + 1
               else f"the indices run to {max(indices)}")
        raise MissingBlocks(
            f"the checkpoint lacks transformer block(s) {shown}: it holds {len(indices)} of "
            f"{depth} blocks ({why}). Loading what is there would build a different, shallower "
            "model. The file is incomplete or was edited: restore it from its source "
            "(`vitkit doctor FILE` reports what is missing)", missing, len(indices))
    return depth


# timm architectures whose forward differs in a way their keys do not show, by name
_NOT_IN_THE_KEYS = {"_rpn_": "post-norm blocks (timm's ResPostBlock)"}


def unsupported(state: StateDict, config: dict) -> list[str]:
    """What a timm-layout checkpoint has that vitkit's ViT cannot express (empty when none)."""
    keys = list(state)
    arch = str(config.get("architecture", ""))
    found = [what for part, what in _NOT_IN_THE_KEYS.items() if part in arch]
    if any("relative_position_bias_table" in k for k in keys):
        found.append("relative position bias (BEiT, BEiT v2, Data2Vec)")
    if any(k.endswith(("attn.q_norm.weight", "attn.k_norm.weight")) for k in keys):
        found.append("query/key normalisation (QK-norm)")
    return found + timm_eva.unsupported(state, config)


def ambiguity(state: StateDict, config: dict, family: dict) -> str | None:
    """Why the weights alone cannot say which model they are (None when they can): the rotary
    variant of timm's Eva layout is not stored, and a Perception Encoder's bare weights (an
    absolute table, rotary embeddings unseen) look like a pre-norm ViT with attention pooling."""
    if "rope" in family:  # the family table or the config.json says (none is an answer too)
        return None
    arch = config.get("architecture")
    named = f"timm's {arch}, which vitkit does not build," if arch else "a bare state dict"
    if timm_eva.is_eva(state):
        return (f"{named} in timm's Eva layout (EVA-02, DINOv3, Perception Encoder, the RoPE "
                "ViTs): the weights do not say which rotary position embeddings (or block "
                "form) it uses")
    if "norm_pre.weight" in state and "attn_pool.latent" in state and not arch:
        return ("a bare state dict with a LayerNorm before the blocks and attention pooling, as "
                "timm's Perception Encoder has: its rotary position embeddings are not in the "
                "weights, so it would load without them and give different outputs")
    return None


def to_vitkit(state: StateDict, config: dict | None, notes: list[str],
              named: dict | None = None):
    """timm keys -> (vitkit state dict, VisionTransformer kwargs, metadata).

    ``named`` (the config fields of a registered name, ``load_model(path, model=NAME)``) says
    what a bare file does not, in place of the family table of the config's architecture; the
    loader checks the result against it."""
    config = config or {}
    missing = unsupported(state, config)
    if missing:
        raise CheckpointError(
            "this checkpoint is a ViT variant vitkit cannot express: it has "
            + "; ".join(missing) + ". The families vitkit loads are the plain ViT, DeiT, "
            "DeiT-III, DINOv2, DINOv3, CLIP, SigLIP, EVA-02, Perception Encoder (core), the "
            "RoPE ViTs, MAE and DINO (`vitkit list` names each model)")
    arch = config.get("architecture")
    # vitkit's names, for a registered architecture (or the one the user named)
    ours = dict(named) if named is not None else MODEL_ARGS.get(arch, {})
    family = {**ours, **_rope_args(config)}
    unclear = ambiguity(state, config, family)
    if unclear:
        raise CheckpointError(
            f"cannot tell which model this is: {unclear}. Load the timm hub folder (its "
            "config.json names the architecture), or a file written by `vitkit convert "
            "--to timm` into a folder")
    if timm_eva.is_eva(state):
        state = timm_eva.to_vitkit_keys(state)
    model_args = {**ours, **dict(config.get("model_args") or {})}  # + timm's argument names
    w = state["patch_embed.proj.weight"]  # (D, C, P, P)
    width, in_chans, patch = w.shape[0], w.shape[1], w.shape[2]
    # the depth a config states (a name's is checked against the blocks by the loader)
    stated = (config.get("model_args") or {}) if named is not None else model_args
    depth = depth_of(state, r"blocks\.(\d+)\.", stated.get("depth"))
    mlp_dim = state["blocks.0.mlp.fc2.weight"].shape[1]
    class_token = "cls_token" in state
    distilled = "dist_token" in state
    regs = state["reg_token"].shape[1] if "reg_token" in state else 0
    fc_norm = "fc_norm.weight" in state
    pool = ours.get("pool") or ("avg" if fc_norm or not class_token else "cls")
    if config.get("global_pool") in ("avg", "token", "map"):
        pool = {"avg": "avg", "token": "cls", "map": "map"}[config["global_pool"]]
    if "attn_pool.latent" in state:
        pool = "map"
    pre_norm = "norm_pre.weight" in state
    act = _ACTS.get(model_args.get("act_layer"), ours.get("act", "gelu"))
    # every CLIP image tower (OpenAI, OpenCLIP, timm's vit_*_clip_*) uses LayerNorm eps 1e-5
    default_eps = 1e-5 if pre_norm else 1e-6
    if pre_norm and "act_layer" not in model_args and "act" not in ours \
            and not family.get("rope"):
        notes.append("a CLIP-style model (LayerNorm before the blocks): LayerNorm eps 1e-5 and "
                     "GELU assumed; OpenAI CLIP weights use QuickGELU: pass the timm "
                     "config.json with its architecture (e.g. "
                     "vit_base_patch16_clip_quickgelu_224)")
    heads = model_args.get("num_heads")  # None: the loader infers it from the family table
    prefix = int(class_token) + int(distilled) + regs
    # timm's VisionTransformer pools by attention over the patch tokens only unless told
    # (pool_include_prefix); its Eva and vitkit over every token (a file vitkit wrote says so)
    if pool == "map" and prefix and not family.get("rope") and not (
            model_args.get("pool_include_prefix") or "pos_antialias" in config):
        raise CheckpointError(
            "this checkpoint is a ViT variant vitkit cannot express: it has a MAP head that "
            "attends to the patch tokens only, beside its [CLS] or register tokens (timm's "
            "default); vitkit's MAP head attends to every token")
    img_size = model_args.get("img_size")
    input_size = (config.get("pretrained_cfg") or {}).get("input_size")
    if img_size is None and input_size:
        img_size = tuple(input_size[1:])  # (C, H, W) -> (H, W)
    if isinstance(img_size, list):
        img_size = tuple(img_size)
    if "pos_embed" in state:
        grid, has_prefix = infer_grid(state["pos_embed"].shape[1], prefix, img_size, patch)
    else:  # rotary embeddings only: the size is the config's (the model takes any)
        grid = tuple(d // patch for d in _pair(img_size or 224))
        has_prefix = not model_args.get("no_embed_class", False)  # as written; changes nothing
    pre_logits = state["pre_logits.fc.weight"].shape[0] if "pre_logits.fc.weight" in state else 0
    kwargs = dict(
        img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch, in_chans=in_chans,
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0,
        embed_dim=width, depth=depth, num_heads=heads, mlp_dim=mlp_dim, pool=pool,
        class_token=class_token, distilled=distilled, num_reg_tokens=regs,
        no_embed_class=prefix > 0 and not has_prefix, fc_norm=fc_norm,
        qkv_bias="blocks.0.attn.qkv.bias" in state, representation_size=pre_logits,
        norm_eps=config.get("norm_eps", ours.get("norm_eps", default_eps)),
        init_values=(model_args.get("init_values") or 1e-5)
        if "blocks.0.ls1.gamma" in state else None,
        pre_norm=pre_norm, patch_bias="patch_embed.proj.bias" in state, act=act,
        head_bias="head.bias" in state or "head.weight" not in state,
        dynamic_img_size=bool(model_args.get("dynamic_img_size",
                                             ours.get("dynamic_img_size", False))),
        pos_antialias=bool(config.get("pos_antialias", ours.get("pos_antialias", False))),
        **timm_eva.kwargs_of(family, state),
    )
    if "blocks.0.attn.q_bias" in state:
        kwargs["qkv_bias"] = True
    return dict(state), kwargs, _metadata(config)


def _pair(size) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else tuple(size)


# timm Eva model_args -> vitkit's names (config.json files that say which rotary variant)
_ROPE_TYPES = {"cat": "axial", "dinov3": "dinov3", "mixed": "mixed"}


def _rope_args(config: dict) -> dict:
    """The rotary settings and MAP heads a config.json states in timm's Eva ``model_args``;
    {} when it states none."""
    args = config.get("model_args") or {}
    if "use_rot_pos_emb" not in args:  # not Eva's arguments: the family table says
        return {"pool_heads": args["attn_pool_num_heads"]} \
            if args.get("attn_pool_num_heads") else {}
    # Eva's arguments, with Eva's defaults for those not given: they say everything
    kind = _ROPE_TYPES.get(args.get("rope_type", "cat")) if args["use_rot_pos_emb"] else ""
    ref = args.get("ref_feat_shape") if kind == "axial" else None
    return dict(rope=kind, rope_temperature=float(args.get("rope_temperature", 10000.0)),
                rope_offset=float(args.get("rope_grid_offset", 0.0)),
                rope_xy=args.get("rope_grid_indexing", "ij") == "xy",
                rope_half=bool(args.get("rope_rotate_half", False)),
                rope_ref_grid=(tuple(ref) if isinstance(ref, (list, tuple)) else (ref, ref))
                if ref else None,
                pool_heads=args.get("attn_pool_num_heads") or 0)


# timm's act_layer names -> vitkit's act
_ACTS = {"gelu": "gelu", "quick_gelu": "quick_gelu", "gelu_tanh": "gelu_tanh"}


def _metadata(config: dict) -> dict:
    pretrained = config.get("pretrained_cfg") or {}
    extra = {k: list(pretrained[k]) for k in ("mean", "std") if k in pretrained}
    if config.get("label_names"):
        extra["class_names"] = list(config["label_names"])
    if config.get("architecture"):
        extra["name"] = config["architecture"]
    return extra


def refusals(cfg) -> list[str]:
    """Why timm's ``VisionTransformer`` (or, for the options only it has, timm's ``Eva``)
    cannot hold this model (empty when it can)."""
    if cnn_refusal(cfg):
        return cnn_refusal(cfg)
    if timm_eva.needs(cfg):
        return bilinear_refusal(cfg) + timm_eva.refusals(cfg)
    return bilinear_refusal(cfg) + [msg for bad, msg in [
        (cfg.representation_size, "has a pre-logits layer (timm's ViT has none)"),
        (cfg.pre_norm and cfg.patch_bias,
         "has a patch-embedding bias and a LayerNorm before the blocks (timm's pre-norm ViT "
         "has no patch bias)"),
    ] if bad]


def write(model, dst: Path) -> Path:
    """A ``.safetensors``/``.pth``/``.bin`` state dict, or a hub-style folder (``config.json``
    + ``model.safetensors``) when ``dst`` has no suffix."""
    state, config = from_vitkit(model)
    if not dst.suffix:
        dst.mkdir(parents=True, exist_ok=True)
        save_safetensors(state, dst / "model.safetensors", {"format": "pt"})
        save_json(config, dst / "config.json")
        return dst
    if dst.suffix == ".safetensors":
        return save_safetensors(state, dst, {"format": "pt"})
    return atomic_write(dst, lambda tmp: torch.save(state, tmp))


def from_vitkit(model) -> tuple[StateDict, dict]:
    """vitkit model -> (timm state dict, timm hub ``config.json``)."""
    cfg = model.cfg
    refuse("timm", refusals(cfg), "Export with --to vitkit, or hf/jax for a pre-logits layer.")
    state = full_state(model)  # timm always has a head bias: a zero one where vitkit has none
    if not cfg.pre_norm:
        state.setdefault("patch_embed.proj.bias", torch.zeros(cfg.embed_dim))
    if timm_eva.needs(cfg):
        return timm_eva.from_vitkit_keys(state), _config(cfg, timm_eva.architecture(cfg),
                                                         timm_eva.model_args(cfg))
    model_args = dict(
        img_size=list(cfg.img_size), patch_size=cfg.patch_size, in_chans=cfg.in_chans,
        embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads,
        mlp_ratio=cfg.mlp_dim / cfg.embed_dim, qkv_bias=cfg.qkv_bias,
        class_token=cfg.class_token, reg_tokens=cfg.num_reg_tokens,
        no_embed_class=cfg.no_embed_class, fc_norm=cfg.fc_norm,
        global_pool={"cls": "token", "avg": "avg", "map": "map"}[cfg.pool],
        init_values=cfg.init_values, pre_norm=cfg.pre_norm, act_layer=cfg.act,
        dynamic_img_size=cfg.dynamic_img_size,
        # vitkit's MAP head attends to every token, prefix ones included
        **({"pool_include_prefix": True} if cfg.pool == "map" and cfg.num_prefix_tokens else {}),
    )
    name = cfg.extra.get("name", "vit_custom")
    if cfg.distilled:
        name = name if name.startswith("deit") else "deit_distilled_custom"
    return state, _config(cfg, name, model_args)


def _config(cfg, name: str, model_args: dict) -> dict:
    """timm's hub ``config.json`` for a model of ``cfg`` built as ``name(**model_args)``."""
    config = {
        "architecture": name,
        "num_classes": cfg.num_classes,
        "num_features": cfg.embed_dim,
        "global_pool": model_args["global_pool"],
        "model_args": model_args,
        "norm_eps": cfg.norm_eps,  # timm's ViT fixes 1e-6; kept here for vitkit to read back
        # timm always antialiases a dynamic table; kept here for vitkit to read back
        "pos_antialias": cfg.pos_antialias,
        "pretrained_cfg": {
            "input_size": [cfg.in_chans, *cfg.img_size],
            "mean": cfg.extra.get("mean", [0.5] * 3),
            "std": cfg.extra.get("std", [0.5] * 3),
            "num_classes": cfg.num_classes,
        },
    }
    if cfg.extra.get("class_names"):
        config["label_names"] = list(cfg.extra["class_names"])
    return config
