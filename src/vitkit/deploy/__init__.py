"""Deployment: vitkit models as files other runtimes execute.

- :mod:`vitkit.deploy.onnx_export`: one ONNX graph for every batch size and resolution (the
  position table interpolated inside it), optional attention outputs, preprocessing metadata;
- :mod:`vitkit.deploy.runtime`: an ONNX file run by onnxruntime, behaving like a model for
  ``vitkit eval`` and ``vitkit predict``.

:func:`export` and :func:`convert` are ``vitkit.export`` and ``vitkit.convert``: ``to="onnx"``
comes here, every checkpoint layout goes to :mod:`vitkit.checkpoints`. onnx, onnxscript and
onnxruntime come with the ``deploy`` extra.
"""

from __future__ import annotations

import os
from pathlib import Path

from vitkit import checkpoints
from vitkit.checkpoints.common import CheckpointError
from vitkit.checkpoints.io import load_model, say
from vitkit.deploy.onnx_export import export_onnx
from vitkit.models.pos_embed import Pair

__all__ = ["DEPLOY", "convert", "export", "export_onnx"]

DEPLOY = ("onnx",)  # the formats written here; the checkpoint layouts are checkpoints.EXPORTS


def _only_onnx(to: str, options: dict) -> None:
    if options and to not in DEPLOY:
        raise CheckpointError(f"{', '.join(sorted(options))} apply to --to onnx only (the "
                              f"{to} layout holds weights, not a graph)")


def export(model, dst: str | os.PathLike, to: str = "vitkit", **options) -> Path:
    """Write ``model`` as ``to``: a checkpoint layout (:data:`vitkit.checkpoints.EXPORTS`) or
    ``"onnx"`` (``attention=True`` adds the attention maps as an output)."""
    _only_onnx(to, options)
    if to == "onnx":
        return export_onnx(model, dst, **options)
    return checkpoints.export(model, dst, to)


def convert(src: str | os.PathLike, dst: str | os.PathLike, to: str | None = None,
            img_size: Pair | None = None, num_classes: int | None = None,
            verbose: bool = True, model: str | None = None, **options) -> Path:
    """Load ``src`` (any format vitkit reads; ``model``: the registered architecture of a bare
    state dict), optionally resize / re-head it, and write ``dst`` as ``to`` (see
    :func:`vitkit.checkpoints.convert` for the default)."""
    _only_onnx(to or "vitkit", options)
    if to != "onnx":
        return checkpoints.convert(src, dst, to=to, img_size=img_size,
                                   num_classes=num_classes, verbose=verbose, model=model)
    model = load_model(src, num_classes=num_classes, img_size=img_size, verbose=verbose,
                       model=model)
    out = export_onnx(model, dst, **options)
    say(f"wrote {out} (onnx: dynamic batch"
        + ("" if not hasattr(model.cfg, "patch_size") else ", height and width")
        + (", attention outputs" if options.get("attention") else "") + ")", verbose)
    return out
