"""``vitkit study``: the article's training claims, measured on your data.

``data`` mode (:mod:`vitkit.train.study`): (a) a ViT against ResNet-18 and a narrow ResNet-18
of about the ViT's compute as the data grows; (b) both pre-trained on a disjoint source set and
fine-tuned; (c) augmentation (a stated sweep) and distillation from the CNN; (d) fine-tuning at
twice the resolution with the position table interpolated. Nested subsets, several seeds, an
equal-epochs budget with a floor; every run is ``vitkit train``; a rerun resumes. ``patch``
mode trains one ViT per patch size (and image size) and sets accuracy against FLOPs per image.
Each writes a CSV, a Markdown report and a plot.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from vitkit.train.patch_study import PatchStudyOptions, run_patch_study
from vitkit.train.study import FULL_PLAN, QUICK_PLAN, Study, StudyPlan, default_source, plan_dict
from vitkit.train.study_report import write_data_report, write_patch_report
from vitkit.util.files import atomic_write

NAME = "study"
HELP = "the article's training claims on your data: ViT vs CNN, pre-training, augmentation, 2x"
DESCRIPTION = ("--mode data: ViT vs ResNet-18 (and one of the ViT's compute) on nested subsets, "
               "pre-trained arms, DeiT-style augmentation and distillation, and fine-tuning at "
               "twice the resolution; seeds, error bars, resumable. --mode patch: one ViT per "
               "patch size, accuracy vs FLOPs.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=["data", "patch"], default="data")
    p.add_argument("--full", action="store_true",
                   help="the committed run: Fashion-MNIST 5-9 as target, 0-4 as source, 3 seeds "
                        "(about 40 minutes on 2 cores)")
    p.add_argument("--data", default=None,
                   help="target data spec as for train --data (default digits)")
    p.add_argument("--data-root", default=None, help="where Fashion-MNIST/MNIST/CIFAR are")
    p.add_argument("--source", default=None,
                   help="pre-training data for claim (b), disjoint from the target (default: "
                        "fashion-mnist when it is installed, for the digits; 'none' skips (b))")
    p.add_argument("--img-size", type=int, default=None, help="default 16")
    p.add_argument("--vit", default=None, help="default vit_micro_patch4_32")
    p.add_argument("--cnn", default=None, help="the CNN baseline and teacher (default resnet18)")
    p.add_argument("--cnn-small", default=None,
                   help="a CNN of about the ViT's compute (default resnet18_w24)")
    p.add_argument("--fractions", type=float, nargs="+", default=None,
                   help="shares of the training split (default 0.1 0.3 1.0)")
    p.add_argument("--seeds", type=int, default=None, help="repeats per point (default 2)")
    p.add_argument("--epochs", type=float, default=None,
                   help="budget: epochs of each subset (default 5)")
    p.add_argument("--min-steps", type=int, default=None,
                   help="budget floor in optimizer steps (default 60)")
    p.add_argument("--max-steps", type=int, default=None, help="budget cap (default none)")
    p.add_argument("--warmup", type=float, default=None,
                   help="share of every run's steps spent in linear warmup (default 0.1)")
    p.add_argument("--source-steps", type=int, default=None,
                   help="pre-training steps on the source (default 200)")
    p.add_argument("--resolution-steps", type=int, default=None,
                   help="claim (d): fine-tuning steps at twice the size (default 60)")
    p.add_argument("--no-resolution", action="store_true", help="skip claim (d)")
    p.add_argument("--augmentation", choices=["sweep", "light", "heavy"], default=None,
                   help="the augmented arm's level (default: sweep light and heavy)")
    p.add_argument("--steps", type=int, default=None, help="patch mode: steps per run (200)")
    p.add_argument("--batch-size", type=int, default=None, help="default 64")
    p.add_argument("--lr", type=float, default=None, help="at batch 512 (default 8e-3)")
    p.add_argument("--device", default=None, help="auto (default), cpu or cuda")
    p.add_argument("--patch-sizes", type=int, nargs="+", default=None,
                   help="patch mode (default 2 4 8)")
    p.add_argument("--img-sizes", type=int, nargs="+", default=None,
                   help="patch mode: image sizes to sweep as well")
    p.add_argument("--out", default=None,
                   help="default runs/study; run again with the same --out to resume")
    p.add_argument("--keep-checkpoints", action="store_true", default=None,
                   help="keep every run's weights (default: only while a later run needs them)")


def plan_from(args: argparse.Namespace) -> StudyPlan:
    chosen = {k: (tuple(v) if isinstance(v, list) else v) for k, v in vars(args).items()
              if v is not None and k in StudyPlan.__dataclass_fields__}
    preset = FULL_PLAN if args.full else QUICK_PLAN
    values = {**preset, **chosen}
    if args.data_root:
        values["extra"] = {"data_root": args.data_root}
    if args.no_resolution:
        values["resolution"] = False
    if values.get("source") == "none":
        values["source"] = None
    elif "source" not in values:
        values["source"] = default_source(values.get("data", "digits"))
    return StudyPlan(**values)


def run(args: argparse.Namespace) -> None:
    if args.mode == "data":
        plan = plan_from(args)
        study = Study(plan)
        out = Path(plan.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "plan.json",
                     lambda tmp: tmp.write_text(json.dumps(plan_dict(plan), indent=2)))
        rows = study.run()
        files = write_data_report(rows, plan, out, getattr(study, "sweep_scores", None))
    else:
        chosen = {k: (tuple(v) if isinstance(v, list) else v) for k, v in vars(args).items()
                  if v is not None and k in PatchStudyOptions.__dataclass_fields__}
        opts = PatchStudyOptions(**chosen)
        files = write_patch_report(run_patch_study(opts), opts, Path(opts.out))
    print("wrote " + ", ".join(str(p) for p in files.values()))
