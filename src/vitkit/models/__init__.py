"""Models: the ViT (``vit``), its configuration (``config``, torch-free), its variant table
(``registry``) and position tables. Names are imported on first use, so reading a config does
not import torch."""

import importlib

_WHERE = {
    "AttentionMaps": "vitkit.models.vit", "VisionTransformer": "vitkit.models.vit",
    "ViTConfig": "vitkit.models.config", "create_model": "vitkit.models.registry",
    "list_models": "vitkit.models.registry", "interpolate_pos_embed": "vitkit.models.pos_embed",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'vitkit.models' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
