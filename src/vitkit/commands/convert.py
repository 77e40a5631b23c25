"""``vitkit convert SRC DST``: a checkpoint between formats, resolutions and class counts."""

from __future__ import annotations

import argparse

from vitkit.checkpoints import convert, formats
from vitkit.commands.conversion import convert_arguments

NAME = "convert"
HELP = "convert a checkpoint between formats, resolutions and class counts"
DESCRIPTION = (HELP[0].upper() + HELP[1:] + ". SRC is any checkpoint vitkit reads: "
               + formats.supported() + ".")


def add_arguments(p: argparse.ArgumentParser) -> None:
    convert_arguments(p)


def run(args: argparse.Namespace) -> None:
    convert(args.src, args.dst, to=args.to, img_size=args.img_size, num_classes=args.num_classes)
