"""``vitkit resize SRC DST --img-size S``: a checkpoint at a new resolution, in its own format."""

from __future__ import annotations

import argparse

from vitkit.checkpoints import formats
from vitkit.commands.conversion import convert_arguments
from vitkit.deploy import convert

NAME = "resize"
HELP = "move a checkpoint to a new resolution (interpolates the position table)"
DESCRIPTION = (HELP[0].upper() + HELP[1:] + ". SRC is any checkpoint vitkit reads: "
               + formats.supported() + ".")


def add_arguments(p: argparse.ArgumentParser) -> None:
    convert_arguments(p, resize=True)


def run(args: argparse.Namespace) -> None:
    convert(args.src, args.dst, to=args.to, img_size=args.img_size, num_classes=args.num_classes,
            model=args.model_name)
