"""Argument types and argument sets shared by several commands."""

from __future__ import annotations

import argparse

from vitkit.checkpoints import formats


def size(text: str) -> int | tuple[int, int]:
    """'384' -> 384, '384x512' -> (384, 512)."""
    try:
        parts = [int(p) for p in text.lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or min(parts, default=0) <= 0:
        raise argparse.ArgumentTypeError(f"expected a size like 384 or 384x512, got {text!r}")
    return parts[0] if len(parts) == 1 else (parts[0], parts[1])


def head(text: str) -> int | str:
    """A head index, or the name of a fusion over heads."""
    if text in ("mean", "max", "min"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a head index or mean/max/min, got {text!r}") from None


def convert_arguments(p: argparse.ArgumentParser, resize: bool = False) -> None:
    """The arguments of ``vitkit convert`` (and of ``resize``, where ``--img-size`` is required)."""
    p.add_argument("src", help="checkpoint file or folder")
    p.add_argument("dst", help="output file (or folder for hf and timm hub style)")
    p.add_argument("--img-size", type=size, required=resize,
                   help="new input size, e.g. 384 or 384x512")
    p.add_argument("--num-classes", type=int, default=None,
                   help="new class count (puts a fresh head on)")
    p.add_argument("--to", choices=formats.EXPORTS, default=None if resize else "vitkit",
                   help="output format (convert: vitkit; resize: the source's format)")
