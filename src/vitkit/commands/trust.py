"""``vitkit trust CHECKPOINT --data SPEC | IMAGES...``: how far each explanation method can be
trusted on a model, by checks a random map cannot pass."""

from __future__ import annotations

import argparse
import sys

from vitkit.checkpoints import load_model
from vitkit.commands.options import add_model_option
from vitkit.errors import ConfigError
from vitkit.explain import perturb, trust
from vitkit.explain.methods import METHODS
from vitkit.util.numbers import check_counts
from vitkit.viz import trust as trust_report

NAME = "trust"
HELP = "how far to trust each explanation method: checks a random map cannot pass"
DESCRIPTION = ("For every method that applies to the model: deletion and insertion AUC under "
               "each baseline (constant, blur, ROAD's noisy linear imputation), the share of "
               "random maps it beats and how often it beats them significantly, pointing and "
               "mass in box where boxes are known (cluttered-digits), the model-randomisation "
               "and class-sensitivity verdicts, and seconds per map. Prints the table; writes "
               "trust.csv, trust.md and trust.png to --out.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="any checkpoint vitkit loads")
    add_model_option(p)
    p.add_argument("images", nargs="*", help="image files or folders (or use --data)")
    p.add_argument("--data", default=None,
                   help="a data spec: its first validation images (e.g. cluttered-digits)")
    p.add_argument("--count", type=int, default=32, help="images checked (default 32)")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=None,
                   help="methods to check (default: every one that applies to the model)")
    p.add_argument("--baselines", nargs="+", choices=perturb.BASELINES,
                   default=list(perturb.BASELINES),
                   help="what removed patches are filled with (default: all three)")
    p.add_argument("--random", type=int, default=trust.RANDOM_MAPS,
                   help=f"random maps per image for the floor (default {trust.RANDOM_MAPS})")
    p.add_argument("--steps", type=int, default=16, help="deletion/insertion steps (16)")
    p.add_argument("--sanity-images", type=int, default=8,
                   help="images for the randomisation and class checks (default 8)")
    p.add_argument("--out", default=None, help="folder for trust.csv, trust.md and trust.png")


def run(args: argparse.Namespace) -> int:
    if bool(args.data) == bool(args.images):
        raise ConfigError("give either --data SPEC or image files, not both and not neither "
                          "(e.g. vitkit trust model.safetensors --data cluttered-digits)")
    check_counts((name, getattr(args, name))
                 for name in ("count", "random", "steps", "sanity_images"))
    model = load_model(args.checkpoint, model=args.model_name, verbose=False)
    x, boxes, what, skipped = trust_report.inputs(model, args.data, args.images, args.count)
    for s in skipped:
        print(f"skipped: {s}", file=sys.stderr)
    rows, left_out = trust.method_table(
        model, x, boxes=boxes, methods=args.methods, baselines=tuple(args.baselines),
        n_random=args.random, steps=args.steps, sanity_images=args.sanity_images,
        progress=lambda m: print(f"checked {m}", file=sys.stderr, flush=True))
    title = f"trust checks on {what}"
    print(f"{title}\n\n{trust.table_markdown(rows)}")
    for m in left_out:
        print(f"left out: {m}")
    if args.out:
        files = trust_report.write(rows, args.out, title)
        print("wrote " + ", ".join(str(f) for f in files))
    return 0
