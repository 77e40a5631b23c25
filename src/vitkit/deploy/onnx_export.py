"""A vitkit model as one ONNX graph for every batch size and resolution.

The graph takes ``pixel_values`` (B, C, H, W) with B, H and W dynamic (H and W multiples of the
patch size) and returns ``logits`` (B, classes), or ``features`` (B, D) for a model without a
head; with ``attention=True`` also ``attentions`` (B, layers, heads, T, T), the softmax maps
vitkit's explain methods read. A ViT's position table is interpolated inside the graph to the
input's patch grid exactly as vitkit does it (bicubic, antialiased when the model's
``pos_antialias`` says; ONNX ``Resize``), so one file serves every resolution. The model's
preprocessing (mean, std, size, interpolation), class names and configuration are in the
file's metadata properties (``vitkit.*``), which :mod:`vitkit.deploy.runtime` reads back.

Exported with ``torch.onnx.export(dynamo=True)`` (torch.export, then onnxscript); the file is
written atomically, so a failed export leaves nothing at the path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from vitkit.checkpoints.common import CheckpointError
from vitkit.data.images import preprocessing
from vitkit.models.cnn import is_cnn
from vitkit.util.files import atomic_write

OPSET = 18  # Resize with antialias; onnxruntime 1.16+ runs it
MAX_PROTO = 2 * 1024**3  # one protobuf file holds at most 2 GB
INPUT = "pixel_values"


class ExportGraph(nn.Module):
    """What the ONNX graph computes: the model's forward with the position table always
    interpolated (an identity at the table's own grid, so the grid stays symbolic) and every
    block on every token (vitkit's forward skips the last block's non-readout rows, a
    shortcut the attention outputs cannot take).

    (B, C, H, W) -> logits (B, classes), and with ``attention`` the maps (B, L, h, T, T)."""

    def __init__(self, model: nn.Module, attention: bool = False) -> None:
        super().__init__()
        self.model, self.attention = model, attention

    def forward(self, x: torch.Tensor):
        m = self.model
        if is_cnn(m):
            return m(x)
        out = m.forward_features(x, self.attention, trace=True)
        if not self.attention:
            return m.forward_head(out)
        tokens, maps = out
        return m.forward_head(tokens), torch.stack(list(maps), dim=1)


def refusals(model: nn.Module, attention: bool = False) -> list[str]:
    """Why ``model`` cannot be exported as asked (empty when it can)."""
    out = []
    if attention and is_cnn(model):
        out.append(f"is a CNN ({model.cfg.arch}): it has no attention maps to export "
                   "(drop --attention)")
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    if size >= MAX_PROTO:
        out.append(f"has {size / 1e9:.1f} GB of weights; one ONNX file holds at most 2 GB")
    return out


def metadata(model: nn.Module, attention: bool) -> dict[str, str]:
    """The ``vitkit.*`` metadata properties: what a reader needs to preprocess an image and
    name the classes, without vitkit's Python objects."""
    cfg = model.cfg
    size, mean, std = preprocessing(model)
    props = {
        "vitkit.format": "1",
        "vitkit.family": "cnn" if is_cnn(model) else "vit",
        "vitkit.arch": getattr(cfg, "arch", "") or "",
        "vitkit.img_size": json.dumps([int(v) for v in size]),
        "vitkit.patch_size": str(getattr(cfg, "patch_size", 0) or 0),
        "vitkit.mean": json.dumps([float(v) for v in mean]),
        "vitkit.std": json.dumps([float(v) for v in std]),
        # the resize of vitkit.data.images.resize_and_crop: cover the size, centre-crop
        "vitkit.resize": "bicubic, shorter side to cover the size, centre crop",
        "vitkit.class_names": json.dumps(list(cfg.extra.get("class_names", []))),
        "vitkit.outputs": json.dumps(["logits" if getattr(cfg, "num_classes", 1) else
                                      "features"] + (["attentions"] if attention else [])),
        "vitkit.config": json.dumps(cfg.to_dict() if hasattr(cfg, "to_dict") else {},
                                    default=str),
    }
    if not is_cnn(model):
        props["vitkit.num_prefix_tokens"] = str(cfg.num_prefix_tokens)
        props["vitkit.readout_rows"] = json.dumps(cfg.readout_rows)
    return props


def export_onnx(model: nn.Module, dst: str | os.PathLike, attention: bool = False,
                opset: int = OPSET) -> Path:
    """Write ``model`` to ``dst`` as an ONNX graph with a dynamic batch and, for a ViT, a
    dynamic height and width (multiples of the patch size). See the module docstring."""
    import onnx  # the deploy extra

    problems = refusals(model, attention)
    if problems:
        raise CheckpointError("cannot export to onnx: the model " + "; ".join(problems))
    model = model.eval()
    graph = ExportGraph(model, attention).eval()
    p = 1 if is_cnn(model) else model.cfg.patch_size
    (h, w), _, _ = preprocessing(model)
    example = torch.zeros(2, getattr(model.cfg, "in_chans", 3), h, w)
    batch = torch.export.Dim("batch", min=1, max=4096)
    gh = torch.export.Dim("grid_h", min=1, max=max(2, 8192 // p))
    gw = torch.export.Dim("grid_w", min=1, max=max(2, 8192 // p))
    shapes = {"x": {0: batch, 2: p * gh, 3: p * gw}}
    names = ["logits" if getattr(model.cfg, "num_classes", 1) else "features"]
    names += ["attentions"] if attention else []

    def write(tmp: Path) -> None:
        with torch.no_grad():
            program = torch.onnx.export(graph, (example,), dynamo=True, opset_version=opset,
                                        input_names=[INPUT], output_names=names,
                                        dynamic_shapes=shapes, verbose=False)
        proto = program.model_proto
        for key, value in metadata(model, attention).items():
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.save_model(proto, str(tmp))

    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(dst, write)
