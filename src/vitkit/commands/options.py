"""Argument types and argument sets shared by several commands."""

from __future__ import annotations

import argparse


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


def add_model_option(p: argparse.ArgumentParser) -> None:
    """``--model NAME``: the registered architecture of a bare state dict (any ``vitkit list``
    name), checked against the weights' keys and shapes (``load_model(path, model=NAME)``)."""
    p.add_argument("--model", dest="model_name", default=None, metavar="NAME",
                   help="the architecture of a bare state dict (a `vitkit list` name, e.g. "
                        "vit_small_patch16_dinov3); checked against the weights' shapes")


def add_data_options(p: argparse.ArgumentParser, *, required: bool = True, split: bool = True,
                     shard_size: int | None = None, device: str = "the model runs") -> None:
    """How the commands that stream a data split through a model read it: ``--data``
    (required unless ``required=False``), ``--split`` (unless ``split=False``), ``--limit``,
    ``--batch-size``, ``--shard-size`` (when a default ``shard_size`` is given),
    ``--data-root`` and ``--device`` (``device``: what runs there, for its help)."""
    p.add_argument("--data", required=required, default=None,
                   help="a data spec (e.g. cifar10, cluttered-digits+mark:3) or a folder of "
                        "images (class sub-folders give the labels)")
    if split:
        p.add_argument("--split", choices=["train", "val"], default="val",
                       help="which split of a data spec, or of a folder with train/ and val/ "
                            "(default val)")
    p.add_argument("--limit", type=int, default=None,
                   help="only the first N images of " + ("the split" if split else "each split")
                        + " (default: all)")
    p.add_argument("--batch-size", type=int, default=64, help="images per batch (default 64)")
    if shard_size is not None:
        p.add_argument("--shard-size", type=int, default=shard_size,
                       help=f"images per resumable shard (default {shard_size})")
    p.add_argument("--data-root", default="data",
                   help="where CIFAR, Fashion-MNIST and MNIST are (default data)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help=f"where {device} (default auto: CUDA when there is one)")
