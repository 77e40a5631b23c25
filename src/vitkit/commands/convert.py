"""``vitkit convert SRC DST``: a checkpoint between formats, resolutions and class counts."""

from __future__ import annotations

import argparse

from vitkit.checkpoints import formats
from vitkit.commands.conversion import convert_arguments
from vitkit.deploy import convert

NAME = "convert"
HELP = "convert a checkpoint between formats, resolutions and class counts"
DESCRIPTION = (HELP[0].upper() + HELP[1:] + ". SRC is any checkpoint vitkit reads: "
               + formats.supported() + ".")


def add_arguments(p: argparse.ArgumentParser) -> None:
    convert_arguments(p)
    p.add_argument("--attention", action="store_true",
                   help="--to onnx: the per-layer attention maps as a second output")


def run(args: argparse.Namespace) -> None:
    options = {"attention": True} if args.attention else {}
    convert(args.src, args.dst, to=args.to, img_size=args.img_size, num_classes=args.num_classes,
            model=args.model_name, **options)
