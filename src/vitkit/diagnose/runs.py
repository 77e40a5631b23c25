"""Checks on a training run: from scratch on small data, a recipe that does not suit a ViT, a
model that is not learning, overfitting, instability. They read a run folder (``config.yaml``,
``metrics.csv``, ``train.log``), or a config alone (at the start of ``vitkit train``).

The config is read as a plain mapping, so runs from elsewhere work too when their keys are
timm's or vitkit's (``opt``/``optimizer``, ``lr``, ``weight_decay``, ``warmup_epochs``, ...).
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from vitkit.diagnose.findings import Finding
from vitkit.errors import DataError
from vitkit.recipe import RunPlan, plan_run

# Below ~100k images a ViT from scratch loses to a CNN of the same size; above a few million
# it wins (Dosovitskiy et al. 2021, Fig. 3-4: ImageNet-1k vs ImageNet-21k vs JFT-300M).
SMALL_DATA = 100_000
# A CNN recipe: SGD at lr >= 0.1 without warmup or clipping (Goyal et al. 2017 for ResNets);
# ViTs are trained with AdamW, warmup and clipping (Dosovitskiy et al. 2021; Touvron et al. 2021).
SGD_LR = 0.1
# AdamW fine-tuning above this erases pre-trained features (DeiT fine-tunes at 5e-6 .. 1e-4)
FINETUNE_MAX_LR = 1e-3
# DeiT from scratch: AdamW at 5e-4 x batch / 512, i.e. 4e-3 at a batch of 4096
SCRATCH_MAX_LR = 1e-2
WEIGHT_DECAY = (0.01, 0.3)  # DeiT uses 0.05; outside this range is far from it
HEAVY_AUG_MIN_EPOCHS = 100  # RandAugment + MixUp/CutMix help ViTs over 300 epochs (DeiT);
# `vitkit study` measures that they hurt at short budgets
# Cross-entropy at chance is ln(classes); within 5% of it after the first epochs the model has
# learned nothing (the first thing to check in Karpathy's "A Recipe for Training Neural Nets").
NOT_LEARNING = 0.05
# Overfitting: a relative train/validation loss gap above 10% while the validation loss rises
# 10% from its best (early stopping's signal, Prechelt 1998 "Early Stopping - But When?").
OVERFIT_GAP = 0.10
# Loss spikes: an epoch's train loss above 1.5x the running median of those before it (the
# instabilities of large-lr ViT training, Dehghani et al. 2023 "Scaling ViT to 22B").
SPIKE = 1.5


@dataclass
class Run:
    """What a run folder says."""

    folder: Path | None
    config: dict
    metrics: list[dict] = field(default_factory=list)
    log: str = ""
    plan: dict | None = None  # the trainer's resolved numbers (run.json, a RunPlan) if known

    @property
    def train_images(self) -> int | None:
        if self.plan:
            return int(self.plan["train_images"])
        m = re.search(r"data \S+: (\d+) train", self.log)  # a run folder from before run.json
        return int(m.group(1)) if m else None

    @property
    def classes(self) -> int | None:
        if self.plan:
            return int(self.plan["classes"])
        m = re.search(r"(\d+) classes", self.log)
        return int(m.group(1)) if m else None

    @property
    def vitkit_plan(self) -> RunPlan | None:
        """The run's resolved numbers: the trainer's own (``run.json``), else computed from a
        vitkit config by :func:`vitkit.recipe.plan_run` (one process assumed)."""
        if self.plan:
            return RunPlan(**self.plan)
        if "recipe" not in self.config or self.train_images is None:
            return None  # a foreign config: its lr is the lr itself, its schedule unknown
        try:
            return plan_run(self.config, self.train_images, self.classes or 0)
        except (TypeError, ValueError):
            return None

    @property
    def effective_lr(self) -> float | None:
        """The peak learning rate: vitkit's lr is per 512 images, scaled by the global batch
        (processes and accumulation steps included); another program's is the lr itself."""
        plan = self.vitkit_plan
        if plan is not None:
            return plan.lr
        lr = self.config.get("lr")
        try:
            return float(lr) if lr is not None else None
        except (TypeError, ValueError):
            return None


def read_run(folder: str | Path) -> Run:
    """The config, metrics and log of a run folder."""
    folder = Path(folder)
    if not (folder / "config.yaml").is_file():
        raise DataError(f"{folder} is not a run folder: no config.yaml (expected the folder "
                        "`vitkit train` writes: config.yaml, metrics.csv, train.log)")
    try:
        config = yaml.safe_load((folder / "config.yaml").read_text()) or {}
    except yaml.YAMLError as err:
        raise DataError(f"{folder}/config.yaml is not valid YAML: {err}") from err
    if not isinstance(config, dict):
        raise DataError(f"{folder}/config.yaml must hold a mapping of option: value")
    metrics = []
    if (folder / "metrics.csv").is_file():
        with open(folder / "metrics.csv", newline="") as f:
            for row in csv.DictReader(f):  # cells beyond the header (key None) are ignored
                metrics.append({k: _float(v) for k, v in row.items() if k is not None})
    log = (folder / "train.log").read_text(errors="replace") if (folder / "train.log").is_file() \
        else ""
    return Run(folder, config, metrics, log, _read_plan(folder / "run.json"))


def _read_plan(path: Path) -> dict | None:
    """``run.json`` as the trainer wrote it, or None when absent or not a RunPlan."""
    if not path.is_file():
        return None
    try:
        plan = json.loads(path.read_text())
        RunPlan(**plan)
    except (ValueError, TypeError):
        return None
    return plan


def _float(text) -> float | None:
    """A cell as a number; an empty, short or non-numeric cell is None."""
    try:
        return float(text) if isinstance(text, str) and text else None
    except ValueError:
        return None


def _is_vit(config: dict) -> bool:
    return not str(config.get("model", "vit")).startswith(("resnet", "convnext", "efficientnet"))


# ---------------------------------------------------------------------------------- checks
def check_small_data(run: Run, ctx: dict) -> Finding | None:
    """A ViT from scratch (no --init) on fewer than SMALL_DATA training images."""
    cfg = run.config
    n = run.train_images
    if not _is_vit(cfg) or n is None:
        return None
    if cfg.get("init") or cfg.get("pretrained"):
        return Finding("run.small_data", "ok", f"fine-tuning a pre-trained model on {n:,} images",
                       {"train_images": n})
    if n >= SMALL_DATA:
        return Finding("run.small_data", "ok", f"from scratch on {n:,} images",
                       {"train_images": n})
    return Finding(
        "run.small_data", "warning",
        f"a ViT trained from scratch on {n:,} images (fewer than {SMALL_DATA:,})",
        {"train_images": n, "threshold": SMALL_DATA},
        "A ViT has no built-in locality: it must learn it from data, so below ~100k images a CNN "
        "of the same size wins (the data crossover of the ViT paper).",
        "in order: fine-tune a pre-trained checkpoint (vitkit train --recipe finetune --init "
        "CKPT); distil from a CNN (--distill hard --teacher CNN_CKPT); or the DeiT recipe "
        "(--recipe deit) with enough epochs")


def check_recipe(run: Run, ctx: dict) -> list[Finding]:
    """A CNN optimiser recipe, fine-tuning too hot, weight decay far from 0.05, no warmup from
    scratch, heavy augmentation on a short budget."""
    cfg = run.config
    if not _is_vit(cfg):
        return []
    out = []
    opt = str(cfg.get("opt", cfg.get("optimizer", "adamw"))).lower()
    lr = run.effective_lr
    # any warmup counts: vitkit's and timm's epochs or steps, Hugging Face's steps or ratio
    warmup = next((float(cfg[k]) for k in ("warmup_epochs", "warmup_steps", "warmup_ratio")
                   if float(cfg.get(k, 0) or 0) > 0), 0.0)
    clip = float(cfg.get("clip_grad", 0) or 0)
    scratch = not (cfg.get("init") or cfg.get("pretrained"))
    if opt.startswith("sgd") and lr is not None and lr >= SGD_LR and not warmup and not clip:
        out.append(Finding(
            "run.recipe", "warning",
            f"SGD at lr {lr:g} without warmup or gradient clipping: a CNN recipe",
            {"optimizer": opt, "lr": lr, "warmup_epochs": warmup, "clip_grad": clip},
            "ViTs diverge or train poorly under ResNet schedules; they are trained with AdamW, "
            "a warmup and clipping.",
            "vitkit train --recipe deit (AdamW, lr 5e-4 per 512 images, 5 warmup epochs)"))
    if not scratch and opt.startswith("adam") and lr is not None and lr > FINETUNE_MAX_LR:
        out.append(Finding(
            "run.recipe", "warning", f"fine-tuning with AdamW at lr {lr:g}",
            {"lr": lr, "threshold": FINETUNE_MAX_LR},
            "A learning rate this high erases the pre-trained features in the first steps.",
            "vitkit train --recipe finetune --init CKPT (lr 1e-4 per 512 images)"))
    if scratch and opt.startswith("adam") and lr is not None and lr > SCRATCH_MAX_LR:
        out.append(Finding(
            "run.recipe", "warning", f"AdamW at lr {lr:g} from scratch",
            {"lr": lr, "threshold": SCRATCH_MAX_LR},
            "ViTs are trained with AdamW at about 5e-4 per 512 images (DeiT); far above it the "
            "loss stalls at chance or diverges.",
            "--lr 5e-4 (vitkit scales it by global batch / 512) with --warmup-epochs 5"))
    wd = cfg.get("weight_decay")
    if wd is not None and not WEIGHT_DECAY[0] <= float(wd) <= WEIGHT_DECAY[1]:
        out.append(Finding(
            "run.recipe", "warning", f"weight decay {float(wd):g}, far from 0.05",
            {"weight_decay": float(wd)},
            "ViT recipes use decoupled weight decay around 0.05; much less overfits small data, "
            "much more underfits.", "--weight-decay 0.05"))
    if scratch and not warmup and (cfg.get("steps") or cfg.get("epochs", 0)):
        out.append(Finding(
            "run.recipe", "warning", "no learning-rate warmup for a ViT trained from scratch",
            {"warmup_epochs": warmup},
            "Without warmup, AdamW's first large steps put attention into a state it recovers "
            "from slowly, if at all.",
            "--warmup-epochs 5 (in a short run set by --steps: --warmup-steps, a tenth of them)"))
    heavy = float(cfg.get("randaugment", 0) or 0) > 0 and \
        (float(cfg.get("mixup", 0) or 0) > 0 or float(cfg.get("cutmix", 0) or 0) > 0)
    epochs = _epochs(run)
    if heavy and epochs is not None and epochs < HEAVY_AUG_MIN_EPOCHS:
        out.append(Finding(
            "run.recipe", "warning",
            f"RandAugment with MixUp/CutMix for {epochs:g} epochs",
            {"epochs": epochs, "threshold": HEAVY_AUG_MIN_EPOCHS},
            "Heavy augmentation pays off over hundreds of epochs (DeiT: 300); at short budgets it "
            "costs accuracy (`vitkit study` measures it).",
            "train longer, or lighten it: --randaugment 0 --mixup 0 --cutmix 0"))
    total, warm = _schedule(run)
    if total and warm >= total:
        out.append(Finding(
            "run.recipe", "warning",
            f"a warmup of {warm} steps in a run of {total}: the learning rate never decays",
            {"warmup_steps": warm, "steps": total},
            "The cosine decay never starts, so the run ends at its peak learning rate, where the "
            "loss is noisiest; warmup is usually a few percent of the run.",
            "--warmup-steps about a tenth of --steps, or --warmup-epochs well below --epochs"))
    if not out:
        out.append(Finding("run.recipe", "ok", f"a ViT recipe ({opt}, lr {lr if lr else '?'})",
                           {"optimizer": opt}))
    return out


def _schedule(run: Run) -> tuple[int, int]:
    """(optimizer steps, warmup steps) of a vitkit run as the trainer counts them, or zeros
    where it is not known (a foreign config, an unknown training-set size)."""
    plan = run.vitkit_plan
    return (plan.total_steps, plan.warmup_steps) if plan is not None else (0, 0)


def _epochs(run: Run) -> float | None:
    if run.metrics:
        return run.metrics[-1].get("epoch")
    steps = run.config.get("steps")
    if steps:
        return None  # a step budget: epochs are unknown until the run starts
    return run.config.get("epochs")


def check_learning(run: Run, ctx: dict) -> Finding | None:
    """Train loss still within NOT_LEARNING of ln(classes) after the first epochs."""
    losses = [r["train_loss"] for r in run.metrics if r.get("train_loss") is not None]
    classes = run.classes
    if len(losses) < 2 or not classes or classes < 2:
        return None
    chance = math.log(classes)
    last = losses[-1]
    measured = {"train_loss": last, "ln_classes": chance, "epochs": len(losses)}
    if abs(last - chance) <= NOT_LEARNING * chance:
        return Finding(
            "run.learning", "error",
            f"not learning: the train loss {last:.3f} is still ln({classes}) = {chance:.3f} "
            f"after {len(losses)} epochs", measured,
            "The model predicts at chance: the learning rate is far off, the labels do not "
            "match the images, or the augmentation destroys them.",
            "try --lr 10x lower and higher, --warmup-epochs 1, and no augmentation first")
    return Finding("run.learning", "ok", f"learning: train loss {losses[0]:.3f} -> {last:.3f} "
                   f"(chance {chance:.3f})", measured)


def check_overfitting(run: Run, ctx: dict) -> Finding | None:
    """Validation loss rising from its best while far above the train loss."""
    rows = [r for r in run.metrics if r.get("val_loss") is not None
            and r.get("train_loss") is not None]
    if len(rows) < 3:
        return None
    last = rows[-1]
    best = min(r["val_loss"] for r in rows)
    gap = (last["val_loss"] - last["train_loss"]) / max(last["val_loss"], 1e-12)
    rising = last["val_loss"] > best * (1 + OVERFIT_GAP)
    measured = {"train_loss": last["train_loss"], "val_loss": last["val_loss"],
                "best_val_loss": best, "gap": gap}
    if gap > OVERFIT_GAP and rising:
        return Finding(
            "run.overfitting", "warning",
            f"overfitting: the validation loss rose from {best:.3f} to {last['val_loss']:.3f} "
            f"while the train loss is {last['train_loss']:.3f}", measured,
            "The model memorises the training images; ViTs do so fast on small data.",
            "more data or augmentation (--recipe deit), --drop-path 0.1, fewer epochs, or "
            "fine-tune a pre-trained model; best.safetensors holds the best epoch")
    return Finding("run.overfitting", "ok", "no sign of overfitting", measured)


def check_stability(run: Run, ctx: dict) -> Finding | None:
    """A non-finite loss, or spikes above SPIKE x the running median."""
    if re.search(r"loss became (nan|inf|-inf)", run.log, re.IGNORECASE):
        return Finding(
            "run.stability", "error", "the loss became non-finite and the run stopped", {},
            "A learning rate too high, no warmup, or broken images.",
            "--lr lower, --warmup-epochs 5, --clip-grad 1.0; the last good checkpoint is "
            "last.safetensors")
    losses = [r["train_loss"] for r in run.metrics if r.get("train_loss") is not None]
    spikes = [i + 1 for i in range(2, len(losses))
              if losses[i] > SPIKE * statistics.median(losses[:i])]
    if any(not math.isfinite(v) for v in losses):
        spikes = spikes or [len(losses)]
    if spikes:
        return Finding(
            "run.stability", "warning",
            f"loss spikes above {SPIKE}x the running median at epochs {spikes}",
            {"epochs": spikes},
            "Spikes mean steps too large for the curvature: training is on the edge of "
            "diverging.", "--clip-grad 1.0, a longer --warmup-epochs, or --lr lower")
    if len(losses) >= 3:
        return Finding("run.stability", "ok", "no loss spikes", {"epochs": len(losses)})
    return None
