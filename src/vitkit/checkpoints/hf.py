"""Hugging Face transformers ViT (``ViTModel``, ``ViTForImageClassification``): folders written
by ``save_pretrained``. Separate query/key/value are fused into vitkit's qkv; LayerNorm eps
comes from the config (1e-12 by default there); ``ViTModel``'s pooler (dense + tanh on [CLS])
becomes vitkit's pre-logits layer. Folders written here also hold ``preprocessor_config.json``
so that ``transformers.pipeline("image-classification", model=folder)`` preprocesses exactly as
vitkit does (bicubic resize of the short side, centre crop, the checkpoint's mean/std)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from vitkit.checkpoints import hf_clip, hf_dinov2, hf_dinov3, hf_siglip
from vitkit.checkpoints.common import (
    ROPE_ERA_OPTIONS,
    Checkpoint,
    CheckpointError,
    StateDict,
    bilinear_refusal,
    cnn_refusal,
    full_state,
    new_options_refusal,
    refuse,
    rope_era_refusal,
    strip_prefix,
)
from vitkit.checkpoints.hf_common import act_of, interpolation, interpolation_of
from vitkit.checkpoints.timm import depth_of
from vitkit.checkpoints.writing import save_json, save_safetensors
from vitkit.data.images import DEFAULT_MEAN, DEFAULT_STD
from vitkit.models.cnn import is_cnn

NAME = "hf"
LABEL = "Hugging Face ViT folder (embeddings.patch_embeddings)"
# The ViTConfig fields one of the Hugging Face classes holds (the others refuse them):
# ViTModel / ViTForImageClassification the plain ViT, with a pooler as pre_logits; DINOv3ViTModel
# rotary embeddings, SwiGLU and a q/v bias (below: HOLDS_ROPE_ERA); Dinov2Model
# and Dinov2WithRegistersModel init_values, registers and a patch-only table; CLIP's tower
# pre_norm, no patch bias, a head without bias and QuickGELU; SigLIP's no [CLS] and pool="map".
# Square images only (a config.json has one image_size); a head bias vitkit lacks is written as
# zeros. dynamic_img_size and pos_antialias go in config.json as vitkit's own entries.
HOLDS = frozenset({
    "img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads",
    "mlp_dim", "pool", "class_token", "num_reg_tokens", "no_embed_class", "representation_size",
    "qkv_bias", "init_values", "pre_norm", "patch_bias", "act", "head_bias", "norm_eps",
    "dynamic_img_size", "pos_antialias",
})
# no Hugging Face class vitkit writes has a distillation token or fc_norm; DINOv3ViTModel
# holds the 2025-26 options DINOv3 has (hf_dinov3.py), the others no class
HOLDS_ROPE_ERA = frozenset({"abs_pos", "rope", "rope_temperature", "rope_half", "mlp",
                            "key_bias"})
HOLDS = HOLDS | HOLDS_ROPE_ERA | {"pos_interp"}  # Siglip2VisionModel: a bilinear table
REFUSES = frozenset({"distilled", "fc_norm"}) | (ROPE_ERA_OPTIONS - HOLDS_ROPE_ERA)

# vitkit name <- HF name, per block ("{i}") and outside the blocks.
_BLOCK = {
    "norm1": "layernorm_before",
    "attn.proj": "attention.output.dense",
    "norm2": "layernorm_after",
    "mlp.fc1": "intermediate.dense",
    "mlp.fc2": "output.dense",
}
_TOP = {
    "cls_token": "embeddings.cls_token",
    "pos_embed": "embeddings.position_embeddings",
    "patch_embed.proj.weight": "embeddings.patch_embeddings.projection.weight",
    "patch_embed.proj.bias": "embeddings.patch_embeddings.projection.bias",
    "norm.weight": "layernorm.weight",
    "norm.bias": "layernorm.bias",
    "pre_logits.fc.weight": "pooler.dense.weight",
    "pre_logits.fc.bias": "pooler.dense.bias",
    "head.weight": "classifier.weight",
    "head.bias": "classifier.bias",
}


def detect(ckpt: Checkpoint) -> bool:
    return any(k.endswith("embeddings.patch_embeddings.projection.weight") for k in ckpt.state)


# the Hugging Face model types this layout reads, and why the others on its keys are refused
READS = ("vit", "vit_mae", "vit_msn")
OTHERS = {"beit": "relative position bias (BEiT)",
          "data2vec-vision": "relative position bias (Data2Vec vision is BEiT's layout)",
          "deit": "Hugging Face's DeiT layout (load timm's deit_* weights instead)",
          "ijepa": "Hugging Face's I-JEPA layout (no [CLS] token, a table without its row)"}


def to_vitkit(state: StateDict, config: dict | None, notes: list[str]):
    if not config:
        raise CheckpointError("a Hugging Face ViT needs its config.json beside the weights "
                              "(load the folder save_pretrained wrote, not the bare file)")
    kind = config.get("model_type", "vit")
    if kind not in READS:
        what = OTHERS.get(kind, "a model type vitkit does not read")
        raise CheckpointError(
            f"this is a Hugging Face {kind} model ({', '.join(config.get('architectures') or [])})"
            f": {what}. vitkit reads the Hugging Face ViT, ViT-MAE, ViT-MSN, DINOv2, DINOv3, "
            "CLIP, SigLIP and SigLIP 2 layouts")
    act = act_of(config)
    state = strip_prefix(state, "vit.")
    state.pop("embeddings.mask_token", None)  # only used for masked-image-modelling
    depth = depth_of(state, r"encoder\.layer\.(\d+)\.", config.get("num_hidden_layers"))
    out: StateDict = {}
    for ours, theirs in _TOP.items():
        if theirs in state:
            out[ours] = state.pop(theirs)
    for i in range(depth):
        hf = f"encoder.layer.{i}."
        for part in ("weight", "bias"):
            qkv = [state.pop(f"{hf}attention.attention.{n}.{part}", None)
                   for n in ("query", "key", "value")]
            if all(t is not None for t in qkv):
                out[f"blocks.{i}.attn.qkv.{part}"] = torch.cat(qkv, 0)
            for ours, theirs in _BLOCK.items():
                if f"{hf}{theirs}.{part}" in state:
                    out[f"blocks.{i}.{ours}.{part}"] = state.pop(f"{hf}{theirs}.{part}")
    out.update(state)  # anything left is reported as unexpected by the strict load
    patch = config.get("patch_size", 16)
    img = config.get("image_size", 224)
    img = (img, img) if isinstance(img, int) else tuple(img)
    has_pooler = "pre_logits.fc.weight" in out
    if has_pooler and config.get("pooler_act", "tanh") != "tanh":
        raise CheckpointError(f"pooler_act {config['pooler_act']!r} is not supported (tanh is)")
    kwargs = dict(
        img_size=img, patch_size=patch, in_chans=config.get("num_channels", 3),
        num_classes=out["head.weight"].shape[0] if "head.weight" in out else 0,
        embed_dim=config["hidden_size"], depth=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"], mlp_dim=config["intermediate_size"],
        qkv_bias=config.get("qkv_bias", True), norm_eps=config.get("layer_norm_eps", 1e-12),
        representation_size=out["pre_logits.fc.weight"].shape[0] if has_pooler else 0,
        act=act,
        **interpolation_of(config),
    )
    extra = {}
    labels = config.get("id2label") or {}
    if labels and "head.weight" in out and len(labels) == kwargs["num_classes"]:
        extra["class_names"] = [labels[k] for k in sorted(labels, key=int)]
    return out, kwargs, extra


def _family(cfg):
    """The Hugging Face class module for the families (SigLIP, CLIP, DINOv2/DeiT-III-style
    LayerScale), or None for the classic ViT."""
    if is_cnn(cfg):
        return None
    if cfg.rope:
        return hf_dinov3
    if cfg.pool == "map":
        return hf_siglip
    if cfg.pre_norm:
        return hf_clip
    if cfg.init_values is not None:
        return hf_dinov2
    return None


def refusals(cfg) -> list[str]:
    """Why no Hugging Face class holds this model (empty when one does): ``ViTModel`` /
    ``ViTForImageClassification``, or for the families ``Dinov2Model``,
    ``CLIPVisionModelWithProjection``, ``SiglipVisionModel``."""
    if cnn_refusal(cfg):
        return cnn_refusal(cfg)
    family = _family(cfg)
    if family is not hf_siglip and bilinear_refusal(cfg):  # SigLIP 2 holds a bilinear table
        return bilinear_refusal(cfg)
    if family is not hf_dinov3 and rope_era_refusal(cfg):
        return rope_era_refusal(cfg)
    if family is not None:
        return family.refusals(cfg)
    return new_options_refusal(cfg) + [msg for bad, msg in [
        (cfg.pool != "cls" or not cfg.class_token, "pools by average (HF ViT pools [CLS])"),
        (cfg.distilled, "is distilled (use --to timm for DeiT)"),
        (cfg.num_reg_tokens > 0, "has register tokens"),
        (cfg.no_embed_class, "has no position row for [CLS]"),
        (cfg.representation_size and cfg.num_classes, "has both a pre-logits layer and a head"),
        (cfg.img_size[0] != cfg.img_size[1], "takes rectangular images"),
    ] if bad]


def preprocessor_config(cfg) -> dict:
    """``preprocessor_config.json`` for ``AutoImageProcessor``: vitkit's preprocessing (scale
    the short side to the input with bicubic resampling, centre-crop, mean/std of the
    checkpoint), which is what ``CLIPImageProcessor`` does."""
    side = cfg.img_size[0]
    return {
        "image_processor_type": "CLIPImageProcessor",
        "do_resize": True, "size": {"shortest_edge": side}, "resample": 3,  # PIL bicubic
        "do_center_crop": True, "crop_size": {"height": side, "width": side},
        "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(cfg.extra.get("mean", DEFAULT_MEAN)),
        "image_std": list(cfg.extra.get("std", DEFAULT_STD)),
        "do_convert_rgb": True,
    }


def write(model, dst: Path) -> Path:
    """A ``save_pretrained``-style folder: ``model.safetensors``, ``config.json`` and
    ``preprocessor_config.json``, for the Hugging Face class that holds the model."""
    family = _family(model.cfg)
    state, config = family.from_vitkit(model) if family is not None else from_vitkit(model)
    dst.mkdir(parents=True, exist_ok=True)
    save_safetensors(state, dst / "model.safetensors", {"format": "pt"})
    save_json(config, dst / "config.json")
    save_json(preprocessor_config(model.cfg), dst / "preprocessor_config.json")
    return dst


def from_vitkit(model) -> tuple[StateDict, dict]:
    """vitkit model -> (HF state dict, HF ``config.json``) for ``ViTForImageClassification``
    (or ``ViTModel`` with a pooler when the model has a pre-logits layer and no head)."""
    cfg = model.cfg
    refuse("Hugging Face ViT", refusals(cfg), "Export with --to timm or vitkit.")
    state = full_state(model)
    rename = {ours: theirs for ours, theirs in _TOP.items()}
    out: StateDict = {}
    with_head = cfg.num_classes > 0
    prefix = "vit." if with_head else ""
    for key, value in state.items():
        value = value.detach().contiguous()
        if m := re.match(r"blocks\.(\d+)\.(.+)\.(weight|bias)$", key):
            i, name, part = m.groups()
            hf = f"{prefix}encoder.layer.{i}."
            if name == "attn.qkv":
                for n, t in zip(("query", "key", "value"), value.chunk(3, 0), strict=True):
                    out[f"{hf}attention.attention.{n}.{part}"] = t.contiguous()
            else:
                out[f"{hf}{_BLOCK[name]}.{part}"] = value
        elif key.startswith("head."):
            out[rename[key]] = value
        else:
            out[prefix + rename[key]] = value
    config = {
        "architectures": ["ViTForImageClassification" if with_head else "ViTModel"],
        "model_type": "vit",
        "hidden_size": cfg.embed_dim, "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.num_heads, "intermediate_size": cfg.mlp_dim,
        "hidden_act": "gelu", "layer_norm_eps": cfg.norm_eps, "image_size": cfg.img_size[0],
        "patch_size": cfg.patch_size, "num_channels": cfg.in_chans, "qkv_bias": cfg.qkv_bias,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, **interpolation(cfg),
    }
    if cfg.representation_size:
        config.update(pooler_output_size=cfg.representation_size, pooler_act="tanh")
    if with_head:
        names = cfg.extra.get("class_names") or [f"LABEL_{i}" for i in range(cfg.num_classes)]
        config["id2label"] = {str(i): n for i, n in enumerate(names)}
        config["label2id"] = {n: i for i, n in enumerate(names)}
    return out, config
