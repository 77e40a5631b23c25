"""Hugging Face DINOv2 (``Dinov2Model``, ``Dinov2WithRegistersModel``): timm-like blocks with
LayerScale (``layer_scale1.lambda1``), q/k/v projections named ``q_proj``/``k_proj``/``v_proj``
(``attention.attention.query`` in transformers 4), and a position table for 518x518 (37x37) with
a [CLS] row, interpolated to every input size (bicubic in float32, antialiased for the models
with registers: vitkit's ``dynamic_img_size`` and ``pos_antialias``, the same arithmetic). With
registers the table has no register rows; vitkit folds the [CLS] row into the [CLS] token (a
constant, so the same numbers) and keeps a patch-only table, as timm does."""

from __future__ import annotations

import torch

from vitkit.checkpoints.common import (
    Checkpoint,
    CheckpointError,
    StateDict,
    cnn_refusal,
    infer_grid,
)
from vitkit.checkpoints.hf_common import HF_ACT, act_of, interpolation, interpolation_of
from vitkit.checkpoints.timm import depth_of
from vitkit.data.images import IMAGENET_MEAN, IMAGENET_STD

NAME = "hf-dinov2"
LABEL = "Hugging Face DINOv2 (encoder.layer.N.layer_scale1.lambda1)"
_QKV = {"q_proj": "query", "k_proj": "key", "v_proj": "value"}
_BLOCK = [("norm1", "norm1"), ("norm2", "norm2"), ("mlp.fc1", "mlp.fc1"),
          ("mlp.fc2", "mlp.fc2")]


def detect(ckpt: Checkpoint) -> bool:
    return any(k.endswith("layer_scale1.lambda1") for k in ckpt.state)


def to_vitkit(state: StateDict, config: dict | None, notes: list[str]):
    config = config or {}
    if config.get("use_swiglu_ffn") or any("weights_in" in k for k in state):
        raise CheckpointError("this DINOv2 (giant) uses a SwiGLU MLP, which vitkit does not "
                              "support; the small, base and large models load")
    state = {k.removeprefix("dinov2."): v for k, v in state.items()}
    state.pop("embeddings.mask_token", None)  # masked-image modelling only
    depth = depth_of(state, r"encoder\.layer\.(\d+)\.", config.get("num_hidden_layers"))
    out: StateDict = {
        "cls_token": state.pop("embeddings.cls_token"),
        "patch_embed.proj.weight": state.pop("embeddings.patch_embeddings.projection.weight"),
        "patch_embed.proj.bias": state.pop("embeddings.patch_embeddings.projection.bias"),
        "norm.weight": state.pop("layernorm.weight"),
        "norm.bias": state.pop("layernorm.bias"),
    }
    pos = state.pop("embeddings.position_embeddings")  # (1, 1 + N, D)
    regs = state.pop("embeddings.register_tokens", None)  # (1, R, D)
    if regs is not None:
        out["cls_token"] = out["cls_token"] + pos[:, :1]
        out["reg_token"] = regs
        pos = pos[:, 1:]
    out["pos_embed"] = pos
    for i in range(depth):
        hf, o = f"encoder.layer.{i}.", f"blocks.{i}."
        for part in ("weight", "bias"):
            qkv = []
            for new, old in _QKV.items():
                t = state.pop(f"{hf}attention.{new}.{part}", None)
                qkv.append(t if t is not None else state.pop(
                    f"{hf}attention.attention.{old}.{part}", None))
            if all(t is not None for t in qkv):
                out[f"{o}attn.qkv.{part}"] = torch.cat(qkv, 0)
            proj = state.pop(f"{hf}attention.o_proj.{part}", None)
            out[f"{o}attn.proj.{part}"] = proj if proj is not None else \
                state.pop(f"{hf}attention.output.dense.{part}")
            for theirs, ours in _BLOCK:
                out[f"{o}{ours}.{part}"] = state.pop(f"{hf}{theirs}.{part}")
        out[f"{o}ls1.gamma"] = state.pop(f"{hf}layer_scale1.lambda1")
        out[f"{o}ls2.gamma"] = state.pop(f"{hf}layer_scale2.lambda1")
    out.update(state)
    patch = out["patch_embed.proj.weight"].shape[-1]
    grid, _ = infer_grid(pos.shape[1], 0 if regs is not None else 1, None, patch)
    kwargs = dict(
        img_size=(grid[0] * patch, grid[1] * patch), patch_size=patch,
        in_chans=out["patch_embed.proj.weight"].shape[1], num_classes=0,
        embed_dim=out["cls_token"].shape[-1], depth=depth,
        num_heads=config.get("num_attention_heads"),
        mlp_dim=out["blocks.0.mlp.fc1.weight"].shape[0],
        init_values=config.get("layerscale_value", 1e-5),  # the learned scales are loaded
        num_reg_tokens=regs.shape[1] if regs is not None else 0,
        no_embed_class=regs is not None, norm_eps=config.get("layer_norm_eps", 1e-6),
        act=act_of(config),
        # interpolated to every input, bicubic, as Dinov2Model does; antialiased as
        # Dinov2WithRegistersModel does (Dinov2Model not), unless vitkit wrote otherwise
        **interpolation_of(config, dynamic=True, antialias=regs is not None),
    )
    return out, kwargs, {"mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}


def refusals(cfg) -> list[str]:
    """Why ``Dinov2Model`` / ``Dinov2WithRegistersModel`` cannot hold this model."""
    return cnn_refusal(cfg) or [msg for bad, msg in [
        (cfg.init_values is None, "has no LayerScale (use the Hugging Face ViT layout)"),
        (cfg.pool != "cls" or cfg.distilled, "does not pool its [CLS] token alone"),
        (cfg.num_classes > 0, "has a head (Dinov2Model is a backbone: export num_classes=0)"),
        (cfg.representation_size,
         "has a pre-logits layer (Dinov2Model ends at its final LayerNorm)"),
        (cfg.num_reg_tokens and not cfg.no_embed_class, "has position rows for its registers"),
        (cfg.pre_norm or not cfg.patch_bias or cfg.act not in ("gelu", "gelu_tanh"),
         "has CLIP options (pre-norm, no patch bias, QuickGELU)"),
        (not cfg.qkv_bias, "has no qkv bias"),
        (cfg.mlp_dim % cfg.embed_dim, "has an MLP width that is not a whole multiple of the "
                                      "width (Dinov2Config's mlp_ratio is an integer)"),
        (cfg.img_size[0] != cfg.img_size[1], "takes rectangular images"),
    ] if bad]


def from_vitkit(model) -> tuple[StateDict, dict]:
    """vitkit model -> (state dict, config.json) of ``Dinov2Model`` (or with registers), in
    transformers 4's key names, which transformers 5 reads too."""
    cfg = model.cfg
    s = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    pos = s["pos_embed"]
    cls = s["cls_token"]
    if cfg.no_embed_class:  # Hugging Face's table has a [CLS] row: zero, the token holds it
        pos = torch.cat([torch.zeros_like(pos[:, :1]), pos], 1)
    out: StateDict = {
        "embeddings.cls_token": cls, "embeddings.mask_token": torch.zeros(1, cfg.embed_dim),
        "embeddings.position_embeddings": pos,
        "embeddings.patch_embeddings.projection.weight": s["patch_embed.proj.weight"],
        "embeddings.patch_embeddings.projection.bias": s["patch_embed.proj.bias"],
        "layernorm.weight": s["norm.weight"], "layernorm.bias": s["norm.bias"],
    }
    if cfg.num_reg_tokens:
        out["embeddings.register_tokens"] = s["reg_token"]
    for i in range(cfg.depth):
        hf, o = f"encoder.layer.{i}.", f"blocks.{i}."
        for part in ("weight", "bias"):
            for n, t in zip(("query", "key", "value"), s[f"{o}attn.qkv.{part}"].chunk(3),
                            strict=True):
                out[f"{hf}attention.attention.{n}.{part}"] = t.contiguous()
            out[f"{hf}attention.output.dense.{part}"] = s[f"{o}attn.proj.{part}"]
            for theirs, ours in _BLOCK:
                out[f"{hf}{theirs}.{part}"] = s[f"{o}{ours}.{part}"]
        out[f"{hf}layer_scale1.lambda1"] = s[f"{o}ls1.gamma"]
        out[f"{hf}layer_scale2.lambda1"] = s[f"{o}ls2.gamma"]
    registers = cfg.num_reg_tokens > 0
    config = {
        "architectures": ["Dinov2WithRegistersModel" if registers else "Dinov2Model"],
        "model_type": "dinov2_with_registers" if registers else "dinov2",
        "hidden_size": cfg.embed_dim, "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads, "mlp_ratio": cfg.mlp_dim // cfg.embed_dim,
        "image_size": cfg.img_size[0], "patch_size": cfg.patch_size,
        "num_channels": cfg.in_chans, "layer_norm_eps": cfg.norm_eps, "qkv_bias": True,
        "layerscale_value": cfg.init_values, "use_swiglu_ffn": False,
        "hidden_act": HF_ACT[cfg.act],
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
        **interpolation(cfg, dynamic=True, antialias=registers),
    }
    if registers:
        config["num_register_tokens"] = cfg.num_reg_tokens
    return out, config
