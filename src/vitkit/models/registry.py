"""The ViT family as one small table, and ``create_model`` / ``list_models`` over it.

Names follow timm: ``vit_{size}_patch{P}_{img}``. The standard sizes (Ti/S/B/L/H) are the ones in
the literature; ``nano`` and ``micro`` are vitkit's own small variants for CPU work on 32x32
images with 4x4 patches (64 tokens), where most first runs happen.

The families built on the plain ViT keep timm's names too, as options of the one model
(``FAMILIES``): DINOv2 (LayerScale, patch 14 at 518, registers), DeiT-III (LayerScale, a
patch-only table), CLIP's image tower (a LayerNorm before the blocks, no patch bias, eps 1e-5,
QuickGELU for OpenAI's weights) and SigLIP (no [CLS], attention pooling). MAE and DINO v1 are
plain ViTs (``vit_base_patch16_224``, ``vit_small_patch8_224``, ...) without a head.
"""

from __future__ import annotations

import difflib

from vitkit.errors import ModelError
from vitkit.models.vit import VisionTransformer, ViTConfig

# size -> (width D, depth, heads, MLP width)
VARIANTS: dict[str, tuple[int, int, int, int]] = {
    "nano": (64, 4, 4, 128),  # vitkit: ~0.2M params, tests and quick demos
    "micro": (128, 6, 4, 512),  # vitkit: ~1.3M params, CPU training on small images
    "tiny": (192, 12, 3, 768),  # Ti
    "small": (384, 12, 6, 1536),  # S
    "base": (768, 12, 12, 3072),  # B
    "medium": (512, 12, 8, 2048),  # DeiT-III M
    "large": (1024, 24, 16, 4096),  # L
    "huge": (1280, 32, 16, 5120),  # H
    "so400m": (1152, 27, 16, 4304),  # SigLIP's shape-optimised 400M
    "betwixt": (640, 12, 10, 2560),  # timm's SBB ViTs
    "mediumd": (512, 20, 8, 2048),
    "huge_plus": (1280, 32, 20, 5120),  # DINOv3 H+ (SwiGLU)
    "7b": (4096, 40, 32, 8192),  # DINOv3 7B (SwiGLU)
    "giant": (1536, 40, 24, 4096),  # DINOv2 g (packed SwiGLU)
}

# (size, patch, image side): the standard ones are exactly those timm defines.
_MODELS: list[tuple[str, int, int]] = [
    ("nano", 4, 32), ("micro", 4, 32),
    ("tiny", 16, 224), ("tiny", 16, 384),
    ("small", 8, 224), ("small", 16, 224), ("small", 16, 384), ("small", 32, 224),
    ("small", 32, 384),
    ("base", 8, 224), ("base", 16, 224), ("base", 16, 384), ("base", 32, 224), ("base", 32, 384),
    ("large", 14, 224), ("large", 16, 224), ("large", 16, 384), ("large", 32, 224),
    ("large", 32, 384),
    ("huge", 14, 224),
]

MODEL_ARGS: dict[str, dict] = {
    f"vit_{size}_patch{patch}_{img}": dict(
        img_size=img, patch_size=patch, embed_dim=VARIANTS[size][0], depth=VARIANTS[size][1],
        num_heads=VARIANTS[size][2], mlp_dim=VARIANTS[size][3],
    )
    for size, patch, img in _MODELS
}


# family -> the options it adds to the plain ViT (timm's defaults for those names)
FAMILIES: dict[str, dict] = {
    # DINOv2 interpolates its 37x37 table to every input, bicubic: without antialias for the
    # original models, with it for those with registers (DINOv2's interpolate_antialias, and
    # Hugging Face's Dinov2Model / Dinov2WithRegistersModel)
    "dinov2": dict(init_values=1e-5, num_classes=0, dynamic_img_size=True),
    "reg4_dinov2": dict(init_values=1e-5, num_reg_tokens=4, no_embed_class=True, num_classes=0,
                        dynamic_img_size=True, pos_antialias=True),
    "deit3": dict(init_values=1e-6, no_embed_class=True),
    "clip": dict(pre_norm=True, patch_bias=False, norm_eps=1e-5),
    "clip_quickgelu": dict(pre_norm=True, patch_bias=False, norm_eps=1e-5, act="quick_gelu",
                           num_classes=512),
    "siglip": dict(class_token=False, pool="map", num_classes=0),
    # 2025-26: rotary position embeddings (models/rope.py), SwiGLU MLPs, registers.
    # DINOv3: no position table, DINOv3's RoPE, 4 registers after [CLS], LayerScale, eps 1e-5,
    # timm's default pooling (the mean of the patch tokens after the final norm); the _qkvb
    # models have a query and value bias (the key bias is zero)
    "dinov3": dict(abs_pos=False, rope="dinov3", rope_temperature=100.0, rope_half=True,
                   num_reg_tokens=4, init_values=1e-5, pool="avg", qkv_bias=False,
                   norm_eps=1e-5, num_classes=0, dynamic_img_size=True),
    # EVA-02: a position table and axial RoPE on the 16x16 grid of pre-training whatever the
    # input's, SwiGLU (packed for T/S; split with a LayerNorm inside for B/L), LayerNorm after
    # the average pool
    "eva02": dict(rope="axial", rope_ref_grid=(16, 16), pool="avg", fc_norm=True,
                  class_token=True, num_classes=0, mlp="glu", key_bias=False,
                  pos_antialias=True),
    # Perception Encoder (core): a position table and axial RoPE on (x, y) from 1, a LayerNorm
    # before the blocks and no patch bias (as CLIP), attention pooling with 8 heads, eps 1e-5
    "pe_core": dict(rope="axial", rope_offset=1.0, rope_xy=True, pre_norm=True,
                    patch_bias=False, pool="map", pool_heads=8, norm_eps=1e-5,
                    pos_antialias=True),
    # RoPE-ViT (Heo et al. 2024, timm's *_rope_*): axial RoPE on (x, y) with base 100, or
    # learned mixed frequencies with base 10; no position table unless _ape (then for the
    # patches only); LayerScale. timm's Eva antialiases a table it moves (pos_antialias)
    "rope": dict(abs_pos=False, rope="axial", rope_temperature=100.0, rope_xy=True,
                 init_values=1e-5, pos_antialias=True),
    "rope_mixed": dict(abs_pos=False, rope="mixed", rope_temperature=10.0, rope_xy=True,
                       init_values=1e-5, pos_antialias=True),
    # timm's SBB RoPE ViTs: registers and no [CLS], average pooling with fc_norm
    "rope_reg_gap": dict(abs_pos=False, rope="axial", rope_ref_grid=(16, 16), class_token=False,
                         pool="avg", fc_norm=True, init_values=1e-5),
}
_QKVB = dict(qkv_bias=True, key_bias=False)  # a query and value bias, none on the key
# (name, size, patch, image side, family, extra options)
_FAMILY_MODELS: list[tuple[str, str, int, int, str, dict]] = [
    *[(f"vit_{s}_patch14_dinov2", s, 14, 518, "dinov2", {}) for s in ("small", "base", "large")],
    *[(f"vit_{s}_patch14_reg4_dinov2", s, 14, 518, "reg4_dinov2", {})
      for s in ("small", "base", "large")],
    ("vit_giant_patch14_dinov2", "giant", 14, 518, "dinov2", dict(mlp="glu")),
    ("vit_giant_patch14_reg4_dinov2", "giant", 14, 518, "reg4_dinov2", dict(mlp="glu")),
    *[(f"deit3_{s}_patch16_{i}", s, 16, i, "deit3", {})
      for s in ("small", "base", "large") for i in (224, 384)],
    ("deit3_medium_patch16_224", "medium", 16, 224, "deit3", {}),
    ("deit3_huge_patch14_224", "huge", 14, 224, "deit3", {}),
    ("vit_base_patch16_clip_224", "base", 16, 224, "clip", {}),
    ("vit_base_patch16_clip_384", "base", 16, 384, "clip", {}),
    ("vit_base_patch32_clip_224", "base", 32, 224, "clip", {}),
    ("vit_large_patch14_clip_224", "large", 14, 224, "clip", {}),
    ("vit_large_patch14_clip_336", "large", 14, 336, "clip", {}),
    ("vit_base_patch16_clip_quickgelu_224", "base", 16, 224, "clip_quickgelu", {}),
    ("vit_base_patch32_clip_quickgelu_224", "base", 32, 224, "clip_quickgelu", {}),
    ("vit_large_patch14_clip_quickgelu_224", "large", 14, 224, "clip_quickgelu",
     dict(num_classes=768)),
    ("vit_large_patch14_clip_quickgelu_336", "large", 14, 336, "clip_quickgelu",
     dict(num_classes=768)),
    *[(f"vit_base_patch16_siglip_{i}", "base", 16, i, "siglip", {}) for i in (224, 256, 384)],
    *[(f"vit_large_patch16_siglip_{i}", "large", 16, i, "siglip", {}) for i in (256, 384)],
    # timm's vit_so400m_patch14_siglip_384 drops the last 6 pixel rows (384 = 27 * 14 + 6);
    # vitkit refuses sizes the patches do not tile, so it is not registered
    *[(f"vit_so400m_patch14_siglip_{i}", "so400m", 14, i, "siglip", {}) for i in (224, 378)],
    *[(f"vit_{s}_patch16_dinov3{q}", s, 16, 256, "dinov3", _QKVB if q else {})
      for s in ("small", "base", "large") for q in ("", "_qkvb")],
    ("vit_tiny_patch16_dinov3_qkvb", "tiny", 16, 256, "dinov3", _QKVB),
    *[(f"vit_{s}_patch16_dinov3{q}", v, 16, 256, "dinov3",
       dict(mlp="swiglu") | (_QKVB if q else {}))
      for s, v in (("small_plus", "small"), ("huge_plus", "huge_plus"))
      for q in ("", "_qkvb")],
    ("vit_7b_patch16_dinov3", "7b", 16, 256, "dinov3", dict(mlp="swiglu")),
    *[(f"eva02_{s}_patch14_{i}", s, 14, i, "eva02",
       dict(mlp_dim=VARIANTS[s][0] * 8 // 3) | (dict(num_classes=1000) if i > 224 else {}))
      for s, i in (("tiny", 224), ("tiny", 336), ("small", 224), ("small", 336))],
    *[(f"eva02_{s}_patch14_{i}", s, 14, i, "eva02",
       dict(mlp_dim=VARIANTS[s][0] * 8 // 3, mlp="swiglu", mlp_norm=True)
       | (dict(num_classes=1000) if i > 224 else {}))
      for s, i in (("base", 224), ("base", 448), ("large", 224), ("large", 448))],
    *[(f"vit_pe_core_{s}_patch{p}_{i}", s, p, i, "pe_core",
       dict(rope_ref_grid=(i // p, i // p), num_classes=c))
      for s, p, i, c in (("tiny", 16, 384, 512), ("small", 16, 384, 512),
                         ("base", 16, 224, 1024), ("large", 14, 336, 1024))],
    *[(f"vit_{s}_patch16_rope_{k}224", s, 16, 224, "rope_mixed" if "mixed" in k else "rope",
       dict(abs_pos=True, no_embed_class=True) if "ape" in k else {})
      for s in ("small", "base", "large")
      for k in ("", "ape_", "mixed_", "mixed_ape_")],
    *[(f"vit_{s}_patch16_rope_reg{r}_gap_256", s, 16, 256, "rope_reg_gap",
       dict(num_reg_tokens=r) | (dict(qkv_bias=False) if s == "mediumd" else _QKVB))
      for s, r in (("medium", 1), ("mediumd", 1), ("betwixt", 4), ("base", 1))],
]
# vitkit's own small models in the layouts of modern ViTs, for CPU training and the explanation
# benchmarks: register tokens (as DINOv2's), and attention pooling by a learned query (SigLIP's)
MODEL_ARGS.update({
    "vit_micro_patch4_32_reg4": {**MODEL_ARGS["vit_micro_patch4_32"], "num_reg_tokens": 4},
    "vit_micro_patch4_32_map": {**MODEL_ARGS["vit_micro_patch4_32"], "class_token": False,
                                "pool": "map"},
    "vit_nano_patch4_32_map": {**MODEL_ARGS["vit_nano_patch4_32"], "class_token": False,
                               "pool": "map"},
    # timm's average-pooled ViT-B/16: 16 heads of 48, not the 12 of 64 of ViT-B
    "vit_base_patch16_gap_224": {**MODEL_ARGS["vit_base_patch16_224"], "num_heads": 16,
                                 "pool": "avg", "class_token": False},
})
MODEL_ARGS.update({
    name: {**dict(img_size=img, patch_size=patch, embed_dim=VARIANTS[size][0],
                  depth=VARIANTS[size][1], num_heads=VARIANTS[size][2],
                  mlp_dim=VARIANTS[size][3]),
           **FAMILIES[family], **extra}
    for name, size, patch, img, family, extra in _FAMILY_MODELS
})


# The mean and std of the pixels each name's default pre-trained weights expect (timm's
# pretrained_cfg of the name's default tag): what a bare state dict loaded by name
# (``load_model(path, model=NAME)``) is preprocessed with, since its file cannot say.
# Every name not listed takes the original ViT's (0.5, 0.5, 0.5) for both.
IMAGENET_NORM = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
CLIP_NORM = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
_NORM_OF_FAMILY = {"deit3": IMAGENET_NORM, "dinov2": IMAGENET_NORM, "reg4_dinov2": IMAGENET_NORM,
                   "dinov3": IMAGENET_NORM, "rope": IMAGENET_NORM, "rope_mixed": IMAGENET_NORM,
                   "eva02": CLIP_NORM, "clip": CLIP_NORM, "clip_quickgelu": CLIP_NORM}
# timm's defaults that differ from their family's: DINO v1's ViT-S/8 (ImageNet), the LAION
# ViT-L/14 CLIP towers fine-tuned on ImageNet (0.5), the SBB betwixt RoPE ViT (CLIP's)
_NORM_OF_NAME = {"vit_small_patch8_224": IMAGENET_NORM,
                 "vit_large_patch14_clip_224": None, "vit_large_patch14_clip_336": None,
                 "vit_betwixt_patch16_rope_reg4_gap_256": CLIP_NORM}
PRETRAINED_NORM: dict[str, tuple[tuple, tuple]] = {
    name: norm for name, norm in (
        {n: _NORM_OF_FAMILY.get(f) for n, _, _, _, f, _ in _FAMILY_MODELS} | _NORM_OF_NAME
    ).items() if norm is not None
}


def list_models(pattern: str | None = None) -> list[str]:
    """Registered model names, sorted; ``pattern`` is a substring filter (``"base"``)."""
    return sorted(n for n in MODEL_ARGS if pattern is None or pattern in n)


def model_args(name: str) -> dict:
    """The constructor arguments a registered name stands for; a clear error if unknown."""
    if name not in MODEL_ARGS:
        close = difflib.get_close_matches(name, MODEL_ARGS, n=5, cutoff=0.6)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ModelError(
            f"unknown model {name!r}.{hint} `vitkit.list_models()` lists all "
            f"{len(MODEL_ARGS)} names."
        )
    return dict(MODEL_ARGS[name])


def build_config(name: str, img_size: int | None = None, patch_size: int | None = None,
                 **overrides) -> ViTConfig:
    """The config of a registered model with the size (and any other) overrides applied."""
    args = {**model_args(name), **overrides}
    if img_size is not None:
        args["img_size"] = img_size
    if patch_size is not None:
        args["patch_size"] = patch_size
    return ViTConfig(**args)


def create_model(name: str, **overrides) -> VisionTransformer:
    """Build a registered ViT with random weights; keyword overrides change any config field.

    >>> create_model("vit_base_patch16_224", num_classes=10, pool="avg", class_token=False)
    """
    args = model_args(name)
    if overrides.get("pool") == "avg" and "class_token" not in overrides:
        overrides["class_token"] = False  # a GAP model has no [CLS] unless asked for one
    if overrides.get("pool", "map") != "map":
        overrides.setdefault("pool_heads", 0)  # the MAP head's heads go with the MAP head
    model = VisionTransformer(**{**args, **overrides})
    model.cfg.extra.setdefault("name", name)
    return model
