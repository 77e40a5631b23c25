"""Checkpoints: one module per layout (registered in ``formats``), and ``io`` to detect, load,
save and convert."""

from vitkit.checkpoints.common import CheckpointError
from vitkit.checkpoints.formats import EXPORTS, FORMATS
from vitkit.checkpoints.io import (
    convert,
    detect_format,
    export,
    load_model,
    load_state,
    read_checkpoint,
    save_model,
)

__all__ = ["EXPORTS", "FORMATS", "CheckpointError", "convert", "detect_format", "export",
           "load_model", "load_state", "read_checkpoint", "save_model"]
