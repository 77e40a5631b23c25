"""``vitkit train``: from scratch, fine-tuning or distilling; options from flags, a YAML file
and a recipe (flags override the file, which overrides the recipe)."""

from __future__ import annotations

import argparse
import os
from dataclasses import fields

from vitkit.errors import ConfigError
from vitkit.train.config import TrainConfig, field_types, resolve
from vitkit.train.trainer import train

NAME = "train"
HELP = "train or fine-tune a ViT or CNN (DeiT recipe, distillation, torchrun)"
DESCRIPTION = ("Train from scratch (--recipe deit), fine-tune (--recipe finetune --init "
               "CHECKPOINT) or distil (--distill hard --teacher CHECKPOINT). Every option can "
               "also come from --config FILE.yaml; flags override the file, which overrides the "
               "recipe. Runs under torchrun unchanged.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="YAML file of options (names as below)")
    p.add_argument("--resume", default=None, help="run folder to continue exactly")
    p.add_argument("--overwrite", action="store_true",
                   help="a new run into a folder that holds one: move the old files aside "
                        "(NAME.replaced-STAMP) instead of refusing")
    types = field_types()
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        t = types[f.name]
        helptext = f"(default: {f.default})"
        if t is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction,
                           default=argparse.SUPPRESS, help=helptext)
        elif t is tuple:
            p.add_argument(flag, type=float, nargs=3, default=argparse.SUPPRESS, help=helptext)
        else:
            p.add_argument(flag, type=t, default=argparse.SUPPRESS, help=helptext)


def run(args: argparse.Namespace) -> None:
    overrides = {k: v for k, v in vars(args).items()
                 if k not in ("command", "run", "config", "resume", "overwrite")}
    if args.resume:
        given = (sorted(overrides) + (["config"] if args.config else [])
                 + (["overwrite"] if args.overwrite else []))
        if given:
            raise ConfigError("--resume continues a run exactly as it was configured (its "
                              "config.yaml); drop the other options "
                              f"({', '.join('--' + g.replace('_', '-') for g in given)})")
        result = train(None, resume=args.resume)
    else:
        result = train(resolve(overrides, args.config), overwrite=args.overwrite)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, one closing line
        if result.history and result.history[-1]["val_top1"] != result.history[-1]["val_top1"]:
            best = min(row["val_loss"] for row in result.history)  # NaN top-1: masked images
            print(f"best reconstruction loss {best:.4f}; encoder in "
                  f"{result.run_dir / 'best.safetensors'}")
        else:
            print(f"best validation top-1 {result.best_top1:.4f}; run folder {result.run_dir}")
