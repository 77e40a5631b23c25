"""vitkit's own format: one ``.safetensors`` whose metadata (``vitkit_config``) holds the whole
config (dims, patch, grid, pooling, eps, prefix tokens) and its ``extra`` (name, mean/std, class
names), so the file alone rebuilds the model, ViT or CNN."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from vitkit.checkpoints.common import Checkpoint, CheckpointError, StateDict
from vitkit.checkpoints.writing import save_safetensors
from vitkit.models.vit import ViTConfig

NAME = "vitkit"
LABEL = "vitkit .safetensors (vitkit_config metadata)"
# The metadata is cfg.to_dict(): every field, whatever its value
HOLDS = frozenset(f.name for f in fields(ViTConfig)) - ViTConfig.NEUTRAL
REFUSES: frozenset[str] = frozenset()
# The file's extra is kept as written: loading it is no conversion, and it already says where
# its weights came from (source_format) if they came from another layout
RECORDS_SOURCE = False


def detect(ckpt: Checkpoint) -> bool:
    return ckpt.vitkit_config is not None


def to_vitkit(state: StateDict, config: dict | None, notes: list[str]):
    """The weights as they are; ``config`` is the file's ``vitkit_config``."""
    kwargs = dict(config or {})
    return state, kwargs, dict(kwargs.pop("extra", None) or {})


def refusals(cfg) -> list[str]:
    return []  # every ViT and CNN vitkit builds fits its own format


def write(model, dst: Path) -> Path:
    if dst.suffix != ".safetensors":
        raise CheckpointError(f"vitkit checkpoints are .safetensors files; got {dst.name!r}. "
                              "Use a name ending in .safetensors.")
    metadata = {"format": "pt", "vitkit_config": json.dumps(model.cfg.to_dict())}
    return save_safetensors(model.state_dict(), dst, metadata)
