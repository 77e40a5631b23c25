"""Checkpoint files written atomically (through :func:`vitkit.util.files.atomic_write`): a
crash or a full disk never leaves a half-written checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import safetensors.torch

from vitkit.checkpoints.common import StateDict
from vitkit.util.files import atomic_write


def save_safetensors(state: StateDict, path: Path, metadata: dict[str, str]) -> Path:
    state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    return atomic_write(path, lambda tmp: safetensors.torch.save_file(state, tmp, metadata))


def save_json(obj: dict, path: Path) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2) + "\n"))
