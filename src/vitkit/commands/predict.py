"""``vitkit predict CHECKPOINT IMAGE_OR_FOLDER...``: top-k classes for image files, as a table on
screen and, with ``--out``, a CSV or JSON file."""

from __future__ import annotations

import argparse
import sys

from vitkit.commands.options import add_model_option
from vitkit.train.evaluate import predict

NAME = "predict"
HELP = "top-k classes for image files or folders"
DESCRIPTION = "Top-k classes for each image; --out writes CSV or JSON."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint")
    add_model_option(p)
    p.add_argument("inputs", nargs="+", help="image files or folders")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--out", default=None, help="predictions.csv or predictions.json")


def run(args: argparse.Namespace) -> int:
    rows = predict(args.checkpoint, args.inputs, top_k=args.top_k, out=args.out,
                   model_name=args.model_name)
    for r in rows:
        if "error" in r:
            print(f"{r['image']}: skipped: {r['error']}", file=sys.stderr)
        else:
            best = ", ".join(f"{t['class']} {t['probability']:.3f}" for t in r["top"])
            print(f"{r['image']}: {best}")
    failed = sum("error" in r for r in rows)
    if failed == len(rows):
        kept = f"; {args.out} was not written" if args.out else ""
        print(f"vitkit predict: error: none of the {failed} images could be read{kept}",
              file=sys.stderr)
        return 2
    if args.out:
        print(f"wrote {args.out}")
    return 0
