"""vitkit: Vision Transformers you can build exactly, load from anywhere and look inside."""

from vitkit import explain
from vitkit.checkpoints import convert, export, load_model, save_model
from vitkit.errors import CheckpointError, ConfigError, DataError, StorageError, VitkitError
from vitkit.models import (
    VisionTransformer,
    ViTConfig,
    create_model,
    interpolate_pos_embed,
    list_models,
)

__version__ = "0.1.0"
__all__ = [
    "CheckpointError", "ConfigError", "DataError", "StorageError", "VisionTransformer",
    "ViTConfig", "VitkitError", "convert", "create_model", "explain", "export",
    "interpolate_pos_embed", "list_models", "load_model", "save_model",
]
