"""``vitkit attention IMAGE... --checkpoint C --out DIR``: explain image files with a checkpoint,
writing figures and raw maps."""

from __future__ import annotations

import argparse
import sys

from vitkit.checkpoints import load_model
from vitkit.commands.options import add_model_option
from vitkit.commands.options import head as head_option
from vitkit.explain import trust
from vitkit.explain.methods import METHODS
from vitkit.viz.attention import explain_images

NAME = "attention"
HELP = "what a model attends to: per-head maps, rollout, gradients"
DESCRIPTION = ("Top-5 prediction, per-head [CLS] maps, a layers x heads mosaic and a chosen "
               "method's map for each image; PNG figures and raw .npy maps in --out.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("images", nargs="+", help="image files (any format PIL reads) or folders")
    p.add_argument("--checkpoint", required=True, help="any checkpoint vitkit loads")
    add_model_option(p)
    p.add_argument("--layer", type=int, default=-1, help="layer of the per-head figure (-1: last)")
    p.add_argument("--head", type=head_option, default=None,
                   help="head index or mean/max/min for the single cls map (default: mean, "
                        "said in the figure); the per-head figure shows every head")
    p.add_argument("--method", choices=list(METHODS), default="rollout",
                   help="attribution method (default: rollout): " + "; ".join(
                       f"{m.name}: {m.summary}" for m in METHODS.values()))
    p.add_argument("--faithfulness", action="store_true",
                   help="also run deletion/insertion, plot the curves beside a random map's, "
                        "and rank the map among 20 random maps (its percentile and p-value)")
    p.add_argument("--top-k", type=int, default=5, help="predictions to print (default 5)")
    p.add_argument("--out", required=True, help="folder for the figures and .npy maps")


def run(args: argparse.Namespace) -> int:
    model = load_model(args.checkpoint, model=args.model_name)
    reports = explain_images(model, args.images, args.out, method=args.method, layer=args.layer,
                             head=args.head, faithfulness=args.faithfulness, top_k=args.top_k)
    for r in reports:
        if r.error:
            print(f"{r.path}: skipped: {r.error}", file=sys.stderr)
            continue
        print(f"{r.path}:")
        for rank, (name, p) in enumerate(r.top, 1):
            print(f"  {rank}. {name}  {p:.3f}")
        for name, scores in r.faithfulness.items():
            beaten = (f"  beats {scores['percentile_vs_random']:.0%} of "
                      f"{trust.RANDOM_MAPS} random maps (p {scores['p_value']:.2f})"
                      if "p_value" in scores else "")
            print(f"  faithfulness {name:<12} deletion AUC {scores['deletion_auc']:.3f}  "
                  f"insertion AUC {scores['insertion_auc']:.3f}{beaten}")
        print("  wrote " + ", ".join(str(f) for f in r.files))
    failed = sum(r.error is not None for r in reports)
    if failed == len(reports):
        unwritten = [r for r in reports if r.unwritten]
        what = (f"none of the {failed} images' results could be written ({unwritten[0].error}); "
                "the images were read: free space or choose another --out"
                if len(unwritten) == failed else
                f"none of the {failed} images could be read")
        print(f"vitkit attention: error: {what}", file=sys.stderr)
        return 2
    return 0
