"""``vitkit info NAME``: a model's parameters by part and its cost per image, as plain text."""

from __future__ import annotations

import argparse

from vitkit.models.summary import summary

NAME = "info"
HELP = "parameters by part and FLOPs per image of a model"
DESCRIPTION = "Parameters by part and cost per image of a registered model."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="a registered name, e.g. vit_base_patch16_224 (see `vitkit list`)")
    p.add_argument("--img-size", type=int, default=None, help="input side in pixels (square)")
    p.add_argument("--patch-size", type=int, default=None, help="patch side in pixels")


def run(args: argparse.Namespace) -> None:
    print(summary(args.name, img_size=args.img_size, patch_size=args.patch_size))
