"""The ViT family as one small table, and ``create_model`` / ``list_models`` over it.

Names follow timm: ``vit_{size}_patch{P}_{img}``. The standard sizes (Ti/S/B/L/H) are the ones in
the literature; ``nano`` and ``micro`` are vitkit's own small variants for CPU work on 32x32
images with 4x4 patches (64 tokens), where most first runs happen.
"""

from __future__ import annotations

import difflib

from vitkit.models.vit import VisionTransformer, ViTConfig

# size -> (width D, depth, heads, MLP width)
VARIANTS: dict[str, tuple[int, int, int, int]] = {
    "nano": (64, 4, 4, 128),  # vitkit: ~0.2M params, tests and quick demos
    "micro": (128, 6, 4, 512),  # vitkit: ~1.3M params, CPU training on small images
    "tiny": (192, 12, 3, 768),  # Ti
    "small": (384, 12, 6, 1536),  # S
    "base": (768, 12, 12, 3072),  # B
    "large": (1024, 24, 16, 4096),  # L
    "huge": (1280, 32, 16, 5120),  # H
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


def list_models(pattern: str | None = None) -> list[str]:
    """Registered model names, sorted; ``pattern`` is a substring filter (``"base"``)."""
    return sorted(n for n in MODEL_ARGS if pattern is None or pattern in n)


def model_args(name: str) -> dict:
    """The constructor arguments a registered name stands for; a clear error if unknown."""
    if name not in MODEL_ARGS:
        close = difflib.get_close_matches(name, MODEL_ARGS, n=5, cutoff=0.6)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ValueError(
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
    model = VisionTransformer(**{**args, **overrides})
    model.cfg.extra.setdefault("name", name)
    return model
