"""vitkit: Vision Transformers you can build exactly, load from anywhere and look inside.

Its names are imported on first use (``vitkit.load_model`` imports the checkpoint readers, and
torch, when it is first touched), so a command or check that needs no model starts fast.
"""

import importlib

__version__ = "0.1.0"

_WHERE = {
    "explain": None,  # a subpackage
    "convert": "vitkit.deploy", "export": "vitkit.deploy",
    "load_model": "vitkit.checkpoints", "save_model": "vitkit.checkpoints",
    "CheckpointError": "vitkit.errors", "ConfigError": "vitkit.errors",
    "DataError": "vitkit.errors", "StorageError": "vitkit.errors", "VitkitError": "vitkit.errors",
    "VisionTransformer": "vitkit.models", "ViTConfig": "vitkit.models",
    "create_model": "vitkit.models", "interpolate_pos_embed": "vitkit.models",
    "list_models": "vitkit.models",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'vitkit' has no attribute {name!r}")
    where = _WHERE[name]
    value = importlib.import_module(f"vitkit.{name}") if where is None else getattr(
        importlib.import_module(where), name)
    globals()[name] = value  # once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
