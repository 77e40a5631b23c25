"""Models: the ViT (``vit``), its variant table (``registry``) and position tables."""

from vitkit.models.pos_embed import interpolate_pos_embed
from vitkit.models.registry import create_model, list_models
from vitkit.models.vit import AttentionMaps, VisionTransformer, ViTConfig

__all__ = [
    "AttentionMaps", "VisionTransformer", "ViTConfig", "create_model", "interpolate_pos_embed",
    "list_models",
]
