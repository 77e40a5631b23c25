"""vitkit's own format: one ``.safetensors`` whose metadata (``vitkit_config``) holds the whole
config (dims, patch, grid, pooling, eps, prefix tokens) and its ``extra`` (name, mean/std, class
names), so the file alone rebuilds the model, ViT or CNN."""

from __future__ import annotations

import json
from pathlib import Path

from vitkit.checkpoints.common import Checkpoint, CheckpointError
from vitkit.checkpoints.writing import save_safetensors

NAME = "vitkit"
LABEL = "vitkit .safetensors (vitkit_config metadata)"


def detect(ckpt: Checkpoint) -> bool:
    return ckpt.vitkit_config is not None


def refusals(cfg) -> list[str]:
    return []  # every ViT and CNN vitkit builds fits its own format


def write(model, dst: Path) -> Path:
    if dst.suffix != ".safetensors":
        raise CheckpointError(f"vitkit checkpoints are .safetensors files; got {dst.name!r}. "
                              "Use a name ending in .safetensors.")
    metadata = {"format": "pt", "vitkit_config": json.dumps(model.cfg.to_dict())}
    return save_safetensors(model.state_dict(), dst, metadata)
