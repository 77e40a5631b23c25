"""Atomic writes: every file goes to a temporary name beside its destination and is renamed into
place, so a crash or a full disk never leaves a half-written checkpoint."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import safetensors.torch

from vitkit.checkpoints.common import StateDict


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def save_safetensors(state: StateDict, path: Path, metadata: dict[str, str]) -> Path:
    state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    return atomic_write(path, lambda tmp: safetensors.torch.save_file(state, tmp, metadata))


def save_json(obj: dict, path: Path) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2) + "\n"))
