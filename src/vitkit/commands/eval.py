"""``vitkit eval CHECKPOINT --data SPEC``: top-1, top-5, per-class accuracy and the confusion
matrix of a checkpoint on a dataset split."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from vitkit.checkpoints.io import atomic_write, load_model
from vitkit.data.datasets import load_split
from vitkit.data.images import preprocessing
from vitkit.data.transforms import Transformed, eval_transform
from vitkit.train.trainer import evaluate
from vitkit.viz import plot

NAME = "eval"
HELP = "top-1/top-5, per-class accuracy, confusion matrix"
DESCRIPTION = "Score a checkpoint on a dataset split."


def evaluate_checkpoint(checkpoint: str | os.PathLike, data: str, split: str = "val",
                        out: str | os.PathLike | None = None, batch_size: int = 256,
                        img_size: int | None = None, **data_options) -> dict:
    """Top-1, top-5, per-class accuracy and the confusion matrix of ``checkpoint`` on a split,
    with the same preprocessing as ``predict`` and ``attention`` (the checkpoint's own).

    With ``out``, writes ``eval.json`` and ``confusion.png`` there. ``img_size``: evaluate at
    another input size, the position table interpolated (bicubic) as ``load_model`` does.
    """
    model = load_model(checkpoint, img_size=img_size)
    (size, _), mean, std = preprocessing(model)
    ds = load_split(data, split, size, **data_options)
    if len(ds.classes) != model.num_classes:
        raise ValueError(f"the checkpoint has {model.num_classes} classes but {data} has "
                         f"{len(ds.classes)}; evaluate on the data it was trained for")
    loader = DataLoader(Transformed(ds, eval_transform(size, mean, std)), batch_size=batch_size)
    metrics = evaluate(model, loader, torch.device("cpu"), len(ds.classes))
    result = {"checkpoint": str(checkpoint), "data": data, "split": split, "images": len(ds),
              "top1": metrics["top1"], "top5": metrics["top5"],
              "per_class": dict(zip(ds.classes, metrics["per_class"], strict=True)),
              "confusion": metrics["confusion"].tolist()}
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "eval.json",
                     lambda tmp: tmp.write_text(json.dumps(result, indent=2) + "\n"))
        plot.save(plot.figure_confusion(metrics["confusion"], ds.classes,
                                        title=f"{Path(checkpoint).name} on {data} ({split})"),
                  out / "confusion.png")
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint")
    p.add_argument("--data", required=True,
                   help="digits, digits:CLASSES, cluttered-digits, fashion-mnist, mnist (also "
                        ":CLASSES, e.g. fashion-mnist:0-4), imagefolder:PATH, cifar10, cifar100")
    p.add_argument("--split", choices=["train", "val"], default="val")
    p.add_argument("--data-root", default="data",
                   help="where CIFAR, Fashion-MNIST and MNIST are (default data)")
    p.add_argument("--out", default=None, help="folder for eval.json and confusion.png")


def run(args: argparse.Namespace) -> None:
    r = evaluate_checkpoint(args.checkpoint, args.data, split=args.split, out=args.out,
                            root=args.data_root)
    print(f"{r['images']} images of {r['data']} ({r['split']}): top-1 {r['top1']:.4f}, "
          f"top-5 {r['top5']:.4f}")
    for name, acc in r["per_class"].items():
        print(f"  {name:<20} {acc:.4f}")
    if args.out:
        print(f"wrote {args.out}/eval.json and {args.out}/confusion.png")
