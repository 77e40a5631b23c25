"""An ONNX file written by vitkit, run by onnxruntime on the CPU, in a model's clothes: what
``vitkit eval`` and ``vitkit predict`` need of a model (``cfg.img_size``, ``cfg.extra`` with
mean, std and class names, ``num_classes``, a forward (B, C, H, W) -> logits), so a user checks
the deployed file with the same commands as the checkpoint it came from.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from vitkit.checkpoints.common import CheckpointError

INSTALL = "pip install 'vitkit[deploy]'"


@dataclass
class OnnxConfig:
    """The part of a model config the commands read, from the file's ``vitkit.*`` metadata."""

    img_size: tuple[int, int]
    num_classes: int
    patch_size: int
    extra: dict = field(default_factory=dict)
    arch: str = "onnx"


def _session(path: Path, threads: int | None):
    try:
        import onnxruntime as ort  # the deploy extra
    except ImportError as err:
        raise CheckpointError(f"reading {path.name} needs onnxruntime: {INSTALL}") from err
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own classes, not exported stably
        text = str(err).replace("\n", " ")
        if "opset" in text.lower() or "version" in text.lower():
            raise CheckpointError(
                f"onnxruntime {ort.__version__} cannot run {path}: {text[:300]}. Export it "
                "again with this vitkit (opset 18), or upgrade onnxruntime") from None
        raise CheckpointError(
            f"{path} is not an ONNX model onnxruntime can read ({text[:300]}); expected a "
            "file written by vitkit convert CKPT --to onnx OUT.onnx") from None


class OnnxModel(nn.Module):
    """``path`` under onnxruntime: (B, C, H, W) float tensor -> logits (B, classes) tensor.

    ``img_size``: preprocess to another size (a vitkit ViT export takes any multiple of its
    patch size). A file without vitkit's metadata is refused: the mean, std and input size
    a reader must use are not in it.
    """

    def __init__(self, path: str | os.PathLike, img_size=None, threads: int | None = None):
        super().__init__()
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"{self.path} does not exist" if not self.path.exists()
                                  else f"{self.path} is a folder, not an ONNX file")
        self.session = _session(self.path, threads)
        meta = self.session.get_modelmeta().custom_metadata_map
        if "vitkit.img_size" not in meta:
            raise CheckpointError(
                f"{self.path} has no vitkit metadata (vitkit.img_size, vitkit.mean, ...): the "
                "input size and normalisation it expects are unknown. vitkit eval and predict "
                "read ONNX files written by vitkit convert CKPT --to onnx OUT.onnx")
        self.metadata = meta
        size = tuple(json.loads(meta["vitkit.img_size"]))
        if img_size is not None:
            size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        outputs = self.session.get_outputs()
        classes = outputs[0].shape[-1]
        names = json.loads(meta.get("vitkit.class_names", "[]"))
        self.cfg = OnnxConfig(
            img_size=size, num_classes=classes if isinstance(classes, int) else len(names),
            patch_size=int(meta.get("vitkit.patch_size", "0")),
            extra={"mean": json.loads(meta["vitkit.mean"]), "std": json.loads(meta["vitkit.std"]),
                   "class_names": names, "source_format": "onnx"})
        self.input = self.session.get_inputs()[0].name
        self.output = outputs[0].name

    @property
    def num_classes(self) -> int:
        return self.cfg.num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (logits,) = self.session.run([self.output], {self.input: _numpy(x)})
        return torch.from_numpy(logits)


def _numpy(x: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(x.detach().to(torch.float32).cpu().numpy())


def is_onnx(path: str | os.PathLike) -> bool:
    """Whether ``path`` names an ONNX file (by its suffix, as users name them)."""
    return Path(path).suffix.lower() == ".onnx"
