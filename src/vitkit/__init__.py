"""vitkit: Vision Transformers you can build exactly, load from anywhere and look inside."""

from vitkit.models import (
    VisionTransformer,
    ViTConfig,
    create_model,
    interpolate_pos_embed,
    list_models,
)

__version__ = "0.1.0"
__all__ = ["VisionTransformer", "ViTConfig", "create_model", "interpolate_pos_embed", "list_models"]
