"""``vitkit convert SRC DST``: a checkpoint between formats, resolutions and class counts."""

from __future__ import annotations

import argparse

from vitkit.checkpoints import convert, formats
from vitkit.commands.options import size

NAME = "convert"
HELP = "convert a checkpoint between formats, resolutions and class counts"
DESCRIPTION = (HELP[0].upper() + HELP[1:] + ". SRC is any checkpoint vitkit reads: "
               + formats.supported() + ".")


def add_arguments(p: argparse.ArgumentParser, resize: bool = False) -> None:
    p.add_argument("src", help="checkpoint file or folder")
    p.add_argument("dst", help="output file (or folder for hf and timm hub style)")
    p.add_argument("--img-size", type=size, required=resize,
                   help="new input size, e.g. 384 or 384x512")
    p.add_argument("--num-classes", type=int, default=None,
                   help="new class count (puts a fresh head on)")
    p.add_argument("--to", choices=formats.EXPORTS, default=None if resize else "vitkit",
                   help="output format (convert: vitkit; resize: the source's format)")


def run(args: argparse.Namespace) -> None:
    convert(args.src, args.dst, to=args.to, img_size=args.img_size, num_classes=args.num_classes)
