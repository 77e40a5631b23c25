"""``vitkit eval CHECKPOINT --data SPEC``: top-1, top-5, per-class accuracy and the confusion
matrix of a checkpoint on a dataset split."""

from __future__ import annotations

import argparse

from vitkit.commands.options import add_model_option
from vitkit.data.datasets import DATASETS
from vitkit.train.evaluate import evaluate_checkpoint

NAME = "eval"
HELP = "top-1/top-5, per-class accuracy, confusion matrix"
DESCRIPTION = "Score a checkpoint on a dataset split."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint")
    add_model_option(p)
    p.add_argument("--data", required=True,
                   help="a data spec: " + ", ".join(DATASETS) + " (CLASSES: e.g. 0-4 or 5,6,7)")
    p.add_argument("--split", choices=["train", "val"], default="val")
    p.add_argument("--data-root", default="data",
                   help="where CIFAR, Fashion-MNIST and MNIST are (default data)")
    p.add_argument("--out", default=None, help="folder for eval.json and confusion.png")


def run(args: argparse.Namespace) -> None:
    r = evaluate_checkpoint(args.checkpoint, args.data, split=args.split, out=args.out,
                            root=args.data_root, model_name=args.model_name)
    print(f"{r['images']} images of {r['data']} ({r['split']}): top-1 {r['top1']:.4f}, "
          f"top-5 {r['top5']:.4f}")
    for name, acc in r["per_class"].items():
        print(f"  {name:<20} {acc:.4f}")
    if args.out:
        print(f"wrote {args.out}/eval.json and {args.out}/confusion.png")
