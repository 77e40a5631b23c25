"""``vitkit demo``: the whole library in one command (:func:`vitkit.train.demo.run_demo`)."""

from __future__ import annotations

import argparse

from vitkit.data.datasets import DATASETS
from vitkit.train.demo import DemoOptions, run_demo

NAME = "demo"
HELP = "train a ViT and a CNN, compare them, draw attention, write report.html"
DESCRIPTION = "The whole library in one command (about 5 minutes on 2 CPU cores)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=None,
                   help="cluttered-digits (default), or any data spec: " + ", ".join(DATASETS))
    p.add_argument("--img-size", type=int, default=None, help="input side (default 32)")
    p.add_argument("--vit", default=None, help="ViT to train (default vit_micro_patch4_32)")
    p.add_argument("--cnn", default=None, help="CNN to train (default resnet18)")
    p.add_argument("--vit-steps", type=int, default=None, help="ViT steps (default 375)")
    p.add_argument("--cnn-steps", type=int, default=None, help="CNN steps (default 150)")
    p.add_argument("--num-images", type=int, default=None,
                   help="validation images to explain (default 4)")
    p.add_argument("--batch-size", type=int, default=None, help="default 64")
    p.add_argument("--out", default=None, help="output folder (default runs/demo)")
    p.add_argument("--quick", action="store_true", help="a tiny smoke run of about a minute")


def run(args: argparse.Namespace) -> None:
    chosen = {k: v for k, v in vars(args).items()
              if k not in ("command", "run", "quick") and v is not None}
    run_demo(DemoOptions.quick(**chosen) if args.quick else DemoOptions(**chosen))
