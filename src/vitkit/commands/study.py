"""``vitkit study``: the article's training claims, measured on your data.

``data`` mode (:mod:`vitkit.train.study`): (a) a ViT against ResNet-18 and a CNN of the ViT's
compute as the data grows; (b) pre-training on a disjoint source; (c) augmentation and
distillation; (d) fine-tuning at twice the resolution. Nested subsets, seeds, a fixed-steps or
converge (early stopping) budget; every run is ``vitkit train``; a rerun resumes. ``patch``
mode: one ViT per patch size, accuracy against FLOPs. Each writes a CSV, Markdown and a plot.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from vitkit.errors import ConfigError
from vitkit.train import regime_study as regime
from vitkit.train import study as plans
from vitkit.train.patch_study import PatchStudyOptions, run_patch_study
from vitkit.train.regime_report import run_regime
from vitkit.train.study import StudyPlan, default_source
from vitkit.train.study_report import run_data_study, write_patch_report

NAME = "study"
HELP = "the article's training claims on your data: ViT vs CNN, pre-training, augmentation, 2x"
DESCRIPTION = ("--mode data: ViT vs ResNet-18 (and one of the ViT's compute) on nested subsets, "
               "pre-trained arms, DeiT-style augmentation and distillation, and fine-tuning at "
               "twice the resolution; seeds, error bars, resumable. --mode patch: one ViT per "
               "patch size, accuracy vs FLOPs. --mode regime: claims (b) and (d) where they "
               "apply.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", choices=["data", "patch", "regime"], default="data", help="regime:"
                   " (b) and (d) in their regime (a source 58-233x the target, MAE, 14 -> 28 "
                   "px; about 2.5 h on 2 cores with --workers 2)")
    p.add_argument("--full", action="store_true", help="the committed fixed-budget run: "
                   "Fashion-MNIST 5-9 target, 0-4 source, 3 seeds (about 40 min on 2 cores)")
    p.add_argument("--converged", action="store_true", help="the converged run: the same data, "
                   "every run to convergence, 1,425 and 5,700 images, 3 seeds (hours)")
    p.add_argument("--data", help="target data spec as for train --data (default digits)")
    p.add_argument("--data-root", default=None, help="where Fashion-MNIST/MNIST/CIFAR are")
    p.add_argument("--source", default=None,
                   help="pre-training data for claim (b), disjoint from the target (default: "
                        "fashion-mnist when it is installed, for the digits; 'none' skips (b))")
    for flag, text in (("img-size", "default 16"), ("vit", "default vit_micro_patch4_32")):
        p.add_argument(f"--{flag}", type=int if flag == "img-size" else str, help=text)
    p.add_argument("--cnn", default=None, help="the CNN baseline and teacher (default resnet18)")
    p.add_argument("--cnn-small", default=None,
                   help="a CNN of about the ViT's compute (default resnet18_w24)")
    for flag, kind, text in (
            ("fractions", float, "shares of the training split (default 0.1 0.3 1.0)"),
            ("target-images", int, "regime: target training-set sizes (150 600)"),
            ("cnn-fractions", float, "the shares --cnn trains on when not the teacher (all)"),
            ("patch-sizes", int, "patch mode (default 2 4 8)"),
            ("img-sizes", int, "patch mode: image sizes to sweep as well")):
        p.add_argument(f"--{flag}", type=kind, nargs="+", default=None, help=text)
    for flag, kind, text in (
            ("seeds", int, "repeats per point (default 2)"),
            ("epochs", float, "budget: epochs of each subset (default 5)"),
            ("min-steps", int, "budget floor in optimizer steps (default 60)"),
            ("max-steps", int, "budget cap (default none)"),
            ("warmup", float, "share of every run's steps spent in linear warmup (0.1)"),
            ("source-steps", int, "pre-training steps on the source (default 200)"),
            ("resolution-steps", int, "claim (d): fine-tuning steps at twice the size (60)"),
            ("patience", int, "converge: epochs without a better validation loss (5)"),
            ("max-epochs", int, "converge: the most epochs of a run (60)"),
            ("holdout", float, "converge: share of the training split to stop on (0.05)"),
            ("source-epochs", int, "converge: the most epochs of pre-training (30)"),
            ("resolution-epochs", int, "converge: claim (d)'s extra epochs (15)"),
            ("distill-tau", float, "the soft-distilled arm's temperature (3)"),
            ("steps", int, "patch mode: steps per run (200)"),
            ("workers", int, "data mode: processes sharing the cores and the --out (1)"),
            ("anneal-epochs", int, "converge: epochs of annealing after patience (regime: 5)"),
            *regime.REGIME_OPTIONS):
        p.add_argument(f"--{flag}", type=kind, default=None, help=text)
    p.add_argument("--augmentation", choices=["sweep", "light", "heavy"], default=None,
                   help="the augmented arm's level (default: sweep light and heavy)")
    p.add_argument("--budget", choices=["steps", "converge"], help="steps (default) or converge")
    p.add_argument("--distill", nargs="+", choices=["hard", "soft"], default=None,
                   help="the distilled arms (default hard)")
    for flag, text in (("teacher", "distil from --cnn (default) or --cnn-small"),
                       ("pretrained-cnn", "the CNN claim (b) pre-trains (default --cnn)")):
        p.add_argument(f"--{flag}", choices=["cnn", "cnn-small"], default=None, help=text)
    for flag, kind, text in (("batch-size", int, "default 64"),
                             ("lr", float, "at batch 512 (default 8e-3)"),
                             ("device", str, "auto (default), cpu or cuda")):
        p.add_argument(f"--{flag}", type=kind, default=None, help=text)
    p.add_argument("--out", help="default runs/study; run again with the same --out to resume")
    p.add_argument("--no-resolution", action="store_true", help="skip claim (d)")
    p.add_argument("--keep-checkpoints", action="store_true", default=None,
                   help="keep every run's weights (default: only while a later run needs them)")


def plan_from(args: argparse.Namespace) -> StudyPlan:
    in_regime = args.mode == "regime"
    cls = regime.RegimePlan if in_regime else StudyPlan
    chosen = {k: (tuple(v) if isinstance(v, list) else v) for k, v in vars(args).items()
              if v is not None and k in cls.__dataclass_fields__}
    if args.full and args.converged:
        raise ConfigError("--full and --converged are two presets; choose one")
    regime.check_regime_options(in_regime, vars(args))
    preset = (regime.REGIME_PLAN if in_regime else plans.FULL_PLAN if args.full
              else plans.CONVERGED_PLAN if args.converged else plans.QUICK_PLAN)
    values = {**preset, **chosen}
    values.update({"extra": {"data_root": args.data_root}} if args.data_root else {},
                  **({"resolution": False} if args.no_resolution else {}))
    if values.get("source") == "none":
        values["source"] = None
    elif "source" not in values:
        values["source"] = default_source(values.get("data", "digits"))
    return cls(**values)


def run(args: argparse.Namespace) -> None:
    workers = 1 if args.workers is None else args.workers
    if args.mode in ("regime", "data"):
        runner = run_regime if args.mode == "regime" else run_data_study
        files = runner(plan_from(args), workers)
    else:
        chosen = {k: (tuple(v) if isinstance(v, list) else v) for k, v in vars(args).items()
                  if v is not None and k in PatchStudyOptions.__dataclass_fields__}
        opts = PatchStudyOptions(**chosen)
        files = write_patch_report(run_patch_study(opts), opts, Path(opts.out))
    print("wrote " + ", ".join(str(p) for p in files.values()))
