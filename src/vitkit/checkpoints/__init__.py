"""Checkpoints: one module per foreign format, and ``io`` to detect, load, save and convert."""

from vitkit.checkpoints.common import CheckpointError
from vitkit.checkpoints.io import (
    convert,
    detect_format,
    export,
    load_model,
    load_state,
    read_checkpoint,
    save_model,
)

__all__ = ["CheckpointError", "convert", "detect_format", "export", "load_model", "load_state",
           "read_checkpoint", "save_model"]
