"""The arguments ``vitkit convert`` and ``vitkit resize`` share (apart from ``options``, whose
argument types import nothing heavy: the format list here imports the checkpoint readers)."""

from __future__ import annotations

import argparse

from vitkit.checkpoints import formats
from vitkit.commands.options import add_model_option, size


def convert_arguments(p: argparse.ArgumentParser, resize: bool = False) -> None:
    """The arguments of ``vitkit convert`` (and of ``resize``, where ``--img-size`` is required)."""
    p.add_argument("src", help="checkpoint file or folder")
    add_model_option(p)
    p.add_argument("dst", help="output file (or folder for hf and timm hub style)")
    p.add_argument("--img-size", type=size, required=resize,
                   help="new input size, e.g. 384 or 384x512")
    p.add_argument("--num-classes", type=int, default=None,
                   help="new class count (puts a fresh head on)")
    p.add_argument("--to", choices=(*formats.EXPORTS, "onnx"),
                   default=None if resize else "vitkit",
                   help="output format (convert: vitkit; resize: the source's format); onnx "
                        "is a graph for onnxruntime (the deploy extra)")
