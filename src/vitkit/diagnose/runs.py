"""Checks on a training run: from scratch on small data, a recipe that does not suit a ViT, a
model that is not learning, overfitting, instability. They read a run folder's structured files
(``config.yaml``, ``metrics.csv``, ``run.json``, ``result.json``, ``params.json``; never
``train.log``, which is prose for people), or a config alone (at the start of ``vitkit train``).

The config is read as a plain mapping, so runs from elsewhere work too when their keys are
timm's or vitkit's (``opt``/``optimizer``, ``lr``, ``weight_decay``, ``warmup_epochs``, ...).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import statistics
from pathlib import Path

import yaml

from vitkit.diagnose import foreign
from vitkit.diagnose.findings import Finding
from vitkit.diagnose.run_folder import Run
from vitkit.errors import DataError
from vitkit.recipe import RunPlan

log = logging.getLogger("vitkit")

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
# Cross-entropy at chance is ln(classes); within 5% of it the model predicts about as well as a
# constant (the first thing to check in Karpathy's "A Recipe for Training Neural Nets").
NOT_LEARNING = 0.05
# A ViT from scratch often sits near chance for its first few hundred steps (warmup, then the
# attention has to find the patches that matter), so a flat loss is only a verdict after this
# many optimizer steps; before it the check says it cannot tell.
MIN_STEPS = 200
# Where the steps are unknown (timm's summary.csv counts epochs only), 20 epochs stand for
# them: a few steps an epoch on the smallest datasets still add up to MIN_STEPS.
MIN_EPOCHS = 20
# A loss that fell by 1% of ln(classes) over the run, or a validation top-1 that rose 5 points,
# is learning, slowly; a loss 5% above chance is worse than a constant guess: diverging.
FALLING = 0.01
TOP1_RISE = 0.05
# A validation top-1 this far above chance (1 / classes), or a validation loss NOT_LEARNING
# below ln(classes), says the model learns, whatever the training loss says: under label
# smoothing, stochastic depth, MixUp/CutMix and strong crops the training loss is not measured
# on the images the model is judged on, and its floor is raised (Szegedy et al. 2016 for
# smoothing; Zhang et al. 2018 for MixUp).
VAL_TOP1_ABOVE_CHANCE = 0.10
# What raises a training loss above the same model's loss on clean images (vitkit's names;
# the timm reader maps timm's to them), with its neutral value
AUGMENTATION = {"label_smoothing": ("label smoothing", 0.0),
                "drop_path": ("stochastic depth", 0.0), "mixup": ("MixUp", 0.0),
                "cutmix": ("CutMix", 0.0), "randaugment": ("RandAugment", 0.0),
                "random_erasing": ("random erasing", 0.0), "crop_scale": ("crop scale", 1.0),
                "hflip": ("horizontal flips", 0.0)}
# Overfitting: a relative train/validation loss gap above 10% while the validation loss rises
# 10% from its best (early stopping's signal, Prechelt 1998 "Early Stopping - But When?"), or
# a validation loss that stays MEMORISED x above a train loss already MEMORISED_NATS below it
# (the model fits its training images far better than any other).
OVERFIT_GAP = 0.10
MEMORISED = 2.0
MEMORISED_NATS = 0.5
# Loss spikes: an epoch's train loss above 1.5x the running median of those before it (the
# instabilities of large-lr ViT training, Dehghani et al. 2023 "Scaling ViT to 22B").
SPIKE = 1.5


def read_run(folder: str | Path) -> Run:
    """The config, metrics and log of a run folder: vitkit's, timm ``train.py``'s or a Hugging
    Face Trainer's (:mod:`vitkit.diagnose.foreign`)."""
    folder = Path(folder)
    kind = foreign.kind(folder)
    if kind == "timm":
        return foreign.read_timm(folder)
    if kind == "hf":
        return foreign.read_hf(folder)
    if kind is None:
        raise DataError(f"{folder} is not a run folder: expected the folder `vitkit train` "
                        "writes (config.yaml, metrics.csv, train.log), timm train.py's "
                        "(args.yaml, summary.csv) or a Hugging Face Trainer's "
                        "(trainer_state.json)")
    try:
        config = yaml.safe_load((folder / "config.yaml").read_text()) or {}
    except yaml.YAMLError as err:
        raise DataError(f"{folder}/config.yaml is not valid YAML: {err}") from err
    except UnicodeDecodeError as err:
        raise DataError(f"{folder}/config.yaml is not text (a byte {err.object[err.start]:#04x} "
                        f"at position {err.start} is not UTF-8): expected the YAML options "
                        "`vitkit train` writes; restore the file or point the doctor at the "
                        "checkpoint instead") from err
    if not isinstance(config, dict):
        raise DataError(f"{folder}/config.yaml must hold a mapping of option: value")
    metrics = _read_metrics(folder / "metrics.csv") if (folder / "metrics.csv").is_file() else []
    return Run(folder, config, metrics, plan=_read_plan(folder / "run.json"),
               result=_read_result(folder / "result.json"),
               params=_read_result(folder / "params.json"))


def _read_metrics(path: Path) -> list[dict]:
    """metrics.csv's rows as numbers; rows of another length than the header are read (cells
    beyond it ignored, missing ones empty) and named in a warning, never passed silently."""
    metrics, ragged, width = [], [], 0
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, [])
            width = len(header)
            for number, cells in enumerate(reader, start=2):
                if len(cells) != width:
                    ragged.append((number, len(cells)))
                row = dict(zip(header, cells[:width], strict=False))
                metrics.append({k: _float(v) for k, v in row.items()})
    except UnicodeDecodeError as err:
        raise DataError(f"{path} is not text: expected the metrics table `vitkit train` "
                        "writes") from err
    if ragged:
        shown = ", ".join(f"line {n} ({k} cells)" for n, k in ragged[:5]) + (
            f" and {len(ragged) - 5} more" if len(ragged) > 5 else "")
        log.warning("%s: the header has %d columns but %s; cells beyond the header are "
                    "ignored and missing ones read as empty, so the findings on those rows "
                    "may be off (a hand-edited or concatenated file?)", path, width, shown)
    return metrics


def _read_result(path: Path) -> dict | None:
    """``result.json`` (how the run ended) or ``params.json`` (what trained), or None when
    absent; a file that is not a JSON object is named in a warning and read as absent."""
    if not path.is_file():
        return None
    try:
        result = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        log.warning("%s is not the JSON `vitkit train` writes (%s): it is read as absent",
                    path, err)
        return None
    return result if isinstance(result, dict) else None


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
    scratch = None if "init" in run.unknown else not (cfg.get("init") or cfg.get("pretrained"))
    if opt.startswith("sgd") and (scratch or (lr is not None and lr >= SGD_LR)):
        what = "from scratch" if scratch else f"at lr {lr:g}"
        out.append(Finding(
            "run.recipe", "warning",
            f"SGD {what}: a CNN recipe" + ("" if warmup or clip else
                                           ", without warmup or gradient clipping"),
            {"optimizer": opt, "lr": lr, "warmup": warmup, "clip_grad": clip},
            "ViTs trained from scratch with SGD and momentum (the ResNet recipe) train poorly "
            "or diverge, warmup or not; they are trained with AdamW, a warmup and clipping. "
            "(SGD is fine for fine-tuning at a small lr, as the ViT paper does.)",
            "vitkit train --recipe deit (AdamW, lr 5e-4 per 512 images, 5 warmup epochs)"))
    adam = opt.startswith("adam") or "optimizer" in run.unknown  # the Trainer's default: AdamW
    probe = str(cfg.get("freeze") or "") == "backbone"  # nothing pre-trained is updated
    if scratch is False and adam and lr is not None and lr > FINETUNE_MAX_LR and not probe:
        out.append(Finding(
            "run.recipe", "warning", f"fine-tuning with AdamW at lr {lr:g}",
            {"lr": lr, "threshold": FINETUNE_MAX_LR},
            "A learning rate this high erases the pre-trained features in the first steps.",
            "vitkit train --recipe finetune --init CKPT (lr 1e-4 per 512 images)"))
    if scratch is not False and adam and lr is not None and lr > SCRATCH_MAX_LR:
        out.append(Finding(
            "run.recipe", "warning",
            f"AdamW at lr {lr:g}" + (" from scratch" if scratch else ", too high even from "
                                     "scratch"),
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
        out.append(Finding("run.recipe", "ok", f"a ViT recipe ({opt}, lr {lr if lr else '?'})"
                           + (": a linear probe (--freeze backbone), whose lr may be far above "
                              "a fine-tune's, since no pre-trained weight moves" if probe and lr
                              and lr > FINETUNE_MAX_LR else ""),
                           {"optimizer": opt, **({"assumed": "; ".join(run.notes)}
                                                 if run.notes else {})}))
    return out


def _schedule(run: Run) -> tuple[int, int]:
    """(optimizer steps, warmup steps) of a vitkit run as the trainer counts them, or zeros
    where it is not known (a foreign config, an unknown training-set size)."""
    plan = run.vitkit_plan
    return (plan.total_steps, plan.warmup_steps) if plan is not None else (0, 0)


def _epochs(run: Run) -> float | None:
    """The epochs the run is planned for (the same number before and after it ran)."""
    plan = run.vitkit_plan
    if plan is not None and plan.epochs:
        return plan.epochs
    if run.metrics:
        return run.metrics[-1].get("epoch")
    steps = run.config.get("steps")
    if steps:
        return None  # a step budget: epochs are unknown until the run starts
    return run.config.get("epochs")


def _finite(values) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def augmentation(config: dict) -> dict[str, float]:
    """The options of ``config`` that raise the training loss (label smoothing, stochastic
    depth, MixUp/CutMix, RandAugment, random erasing, a crop scale below 1), with their values."""
    out = {}
    for key, (_, neutral) in AUGMENTATION.items():
        raw = config.get(key)
        value = float(raw) if isinstance(raw, bool) else \
            _float(str(raw)) if raw is not None else None
        if value is not None and value != neutral:
            out[key] = value
    return out


def _augmentation_words(used: dict[str, float]) -> str:
    return ", ".join(AUGMENTATION[k][0] if k == "hflip" else f"{AUGMENTATION[k][0]} {v:g}"
                     for k, v in used.items())


def _validation_says(last: dict | None, classes: int) -> tuple[bool, bool]:
    """(good, bad): the last evaluation ``last`` (a metrics row with a finite validation loss,
    or None) clearly learns (top-1 VAL_TOP1_ABOVE_CHANCE above chance, or the loss below it),
    or is worse than chance (the loss above it, top-1 not)."""
    if last is None:
        return False, False
    chance = math.log(classes)
    top1 = last.get("val_top1")
    top1 = top1 / 100 if top1 is not None and top1 > 1 else top1  # timm's percent
    good = last["val_loss"] < chance * (1 - NOT_LEARNING) or (
        top1 is not None and top1 >= 1 / classes + VAL_TOP1_ABOVE_CHANCE)
    return good, last["val_loss"] > chance * (1 + NOT_LEARNING) and not good


def check_learning(run: Run, ctx: dict) -> Finding | None:
    """Is the loss going anywhere? Above chance (diverging), flat at chance after MIN_STEPS
    steps (not learning), near chance but falling (learning, slowly), or too early to tell.

    Validation decides where it exists: a training loss above chance with a good validation is
    a warning that the two disagree (strong augmentation), never "diverging"; a validation
    loss above chance is diverging whatever the training loss says, and a training loss above
    chance is diverging where validation does not contradict it."""
    raw = [r["train_loss"] for r in run.metrics if r.get("train_loss") is not None]
    classes = run.classes
    if run.config.get("objective") == "mae":
        return _reconstruction_learning(raw)
    if not raw or not classes or classes < 2:
        return None
    chance = math.log(classes)
    if len(_finite(raw)) < len(raw):
        return Finding("run.learning", "unknown",
                       "cannot tell: the loss is not a number (see run.stability)",
                       {"epochs": len(raw)},
                       "A NaN or infinite loss says nothing about learning; the run diverged.")
    losses, steps = raw, run.steps
    first, last = losses[0], losses[-1]
    top1 = [r["val_top1"] for r in run.metrics if r.get("val_top1") is not None]
    evaluated = [r for r in run.metrics if r.get("val_loss") is not None
                 and math.isfinite(r["val_loss"])]
    val = [r["val_loss"] for r in evaluated]
    measured = {"train_loss": last, "first_train_loss": first, "ln_classes": chance,
                "epochs": len(losses), "steps": steps if steps is not None else "?"}
    if top1:
        measured["val_top1"] = top1[-1]
    if val:
        measured["val_loss"] = val[-1]
    used = augmentation(run.config)
    if used:
        measured["augmentation"] = _augmentation_words(used)
    good, bad = _validation_says(evaluated[-1] if evaluated else None, classes)
    above = last > chance * (1 + NOT_LEARNING)
    diverging = Finding(
        "run.learning", "error",
        f"diverging: the {'validation ' if bad else ''}loss "
        f"{val[-1] if bad else last:.3f} is above chance, ln({classes}) = {chance:.3f}"
        + (f", the training loss having started at {first:.3f}" if len(losses) > 1 else "")
        + (f"; validation is no better (loss {val[-1]:.3f}"
           + (f", top-1 {top1[-1]:.3f}" if top1 else "") + ")" if val and not bad else ""),
        measured,
        "A loss above what a constant guess scores means confident wrong predictions: the "
        "updates are too large (a learning rate far too high, no warmup) or the labels do "
        "not match the images.",
        "--lr 10x lower with --warmup-epochs 5 and --clip-grad 1.0; check the labels")
    if bad:
        return diverging
    if above and good:  # the two disagree, and the validation decides: it learns
        what = (f"the augmentation is strong for this data ({_augmentation_words(used)})"
                if used else "nothing in the recipe raises the training loss, so the "
                "training images or labels are not the ones validated")
        return Finding(
            "run.learning", "warning",
            f"the training loss {last:.3f} sits above chance, ln({classes}) = {chance:.3f}, "
            f"while validation is good (loss {val[-1]:.3f}"
            + (f", top-1 {top1[-1]:.3f}" if top1 else "") + f"): {what}", measured,
            "The model learns: validation, measured on clean images, says so. The training "
            "loss is measured on augmented images and smoothed or mixed labels, and here those "
            "are hard enough to hold it above what a constant guess scores.",
            "check the crop scale (--crop-scale 0.5 or more keeps the object in view) and the "
            "flips (--no-hflip for digits and text), and lighten what the data cannot take"
            if used else
            "check that the training split's images and labels match the validation split's")
    if above and used and not val:
        return Finding(
            "run.learning", "warning",
            f"cannot tell: the training loss {last:.3f} is above chance, ln({classes}) = "
            f"{chance:.3f}, which {_augmentation_words(used)} can cause, and no validation "
            "numbers say whether the model learns", measured,
            "Under strong augmentation the training loss does not measure the model on the "
            "images it is judged on; only a validation split can decide.",
            "evaluate on a validation split (vitkit train does every epoch; --holdout 0.05 "
            "keeps one out of the training images)")
    if above:  # validation, where there is one, does not contradict it: at chance or worse
        return diverging
    if abs(last - chance) > NOT_LEARNING * chance and not above:
        return Finding("run.learning", "ok", f"learning: train loss {first:.3f} -> {last:.3f} "
                       f"(chance {chance:.3f})", measured)
    if good:  # the training loss near chance, the validation clearly above it: it learns
        return Finding("run.learning", "ok",
                       f"learning, by validation (loss {val[-1]:.3f}"
                       + (f", top-1 {top1[-1]:.3f}" if top1 else "")
                       + f"); the training loss {last:.3f} stays near chance"
                       + (f" under {_augmentation_words(used)}" if used else ""), measured)
    # progress below chance: a loss that fell from far above chance back to it has not learned
    falling = min(first, chance) - last >= FALLING * chance or (
        len(top1) > 1 and top1[-1] - top1[0] >= TOP1_RISE)
    part = run.trains_part  # --freeze, --lora-rank: a share of the model learns
    if part:
        measured["trains"] = part
    if falling:
        return Finding("run.learning", "ok",
                       f"learning, slowly: train loss {first:.3f} -> {last:.3f}, still near "
                       f"chance ({chance:.3f})" + (f"; {part} train" if part else ""), measured,
                       "The loss is falling; more steps will tell how far it goes.")
    enough = steps >= MIN_STEPS if steps is not None else len(losses) >= MIN_EPOCHS
    if not enough:
        return Finding(
            "run.learning", "unknown",
            f"cannot tell yet: the loss is at chance ({last:.3f} vs ln({classes}) = "
            f"{chance:.3f}) after "
            + (f"{steps} steps" if steps is not None else f"{len(losses)} epochs")
            + (f"; {part} train" if part else ""), measured,
            (f"Only {part} train, which at a fine-tuning learning rate move the loss slowly; "
             f"after {MIN_STEPS} steps ({MIN_EPOCHS} epochs where the steps are not recorded) "
             "without the loss falling it is slow, or its frozen features do not fit the data."
             if part else "A ViT from scratch often sits at chance for its first few hundred "
             f"steps; after {MIN_STEPS} steps ({MIN_EPOCHS} epochs where the steps are not "
             "recorded) without the loss falling it is not learning."),
            "train longer (a few hundred steps at least), then ask again")
    if part:  # a probe or adapters at chance: slow, or features that do not fit; not broken
        return Finding(
            "run.learning", "warning",
            f"learning slowly, if at all: the train loss {last:.3f} is still near ln({classes}) "
            f"= {chance:.3f} after {steps if steps is not None else len(losses)} "
            f"{'steps' if steps is not None else 'epochs'}, with only {part} training",
            measured,
            "With the backbone frozen or adapted, the head (and any adapters) are a small share "
            "of the model: at a learning rate meant for fine-tuning the whole model they move "
            "little per step, and the frozen features bound what they can learn. A full "
            "fine-tune flat at chance this long would be broken (an error); this run is slow, "
            "or its backbone's features do not separate these classes.",
            "a higher --lr for the trained share (a linear probe takes 10-100x a fine-tune's), "
            "or train more of the model (--freeze with fewer blocks, a larger --lora-rank, or "
            "no freezing)")
    return Finding(
        "run.learning", "error",
        f"not learning: the train loss {last:.3f} is still ln({classes}) = {chance:.3f} after "
        f"{steps if steps is not None else len(losses)} "
        f"{'steps' if steps is not None else 'epochs'}, and not falling", measured,
        "The model predicts at chance: the learning rate is far off, the labels do not "
        "match the images, or the augmentation destroys them.",
        "try --lr 10x lower and higher, --warmup-epochs 1, and no augmentation first")


def _reconstruction_learning(losses: list) -> Finding | None:
    """Masked-image pre-training has no chance level: is its reconstruction loss falling?"""
    losses = _finite(losses)
    if len(losses) < 2:
        return None
    first, last = losses[0], losses[-1]
    measured = {"train_loss": last, "first_train_loss": first, "epochs": len(losses)}
    if last < first * (1 - FALLING):
        return Finding("run.learning", "ok", f"masked-image pre-training: the reconstruction "
                       f"loss fell {first:.3f} -> {last:.3f}", measured)
    return Finding("run.learning", "warning",
                   f"masked-image pre-training: the reconstruction loss is not falling "
                   f"({first:.3f} -> {last:.3f})", measured,
                   "The encoder learns nothing the decoder can use to fill in the hidden "
                   "patches.", "--lr lower or higher, a longer --warmup-epochs")


def check_overfitting(run: Run, ctx: dict) -> Finding | None:
    """Validation loss rising from its best while far above the train loss, or a validation
    loss that stays far above a train loss near zero (memorising)."""
    rows = [r for r in run.metrics if r.get("val_loss") is not None
            and r.get("train_loss") is not None]
    rows = [r for r in rows if math.isfinite(r["val_loss"]) and math.isfinite(r["train_loss"])]
    if len(rows) < 3:
        return None
    last = rows[-1]
    train_loss, val_loss = last["train_loss"], last["val_loss"]
    best = min(r["val_loss"] for r in rows)
    gap = (val_loss - train_loss) / max(val_loss, 1e-12)
    rising = val_loss > best * (1 + OVERFIT_GAP)
    memorised = val_loss > MEMORISED * train_loss and val_loss - train_loss > MEMORISED_NATS
    measured = {"train_loss": train_loss, "val_loss": val_loss, "best_val_loss": best,
                "gap": gap}
    fix = ("more data or augmentation (--recipe deit), --drop-path 0.1, fewer epochs, or "
           "fine-tune a pre-trained model; best.safetensors holds the best epoch")
    if gap > OVERFIT_GAP and rising:
        return Finding(
            "run.overfitting", "warning",
            f"overfitting: the validation loss rose from {best:.3f} to {val_loss:.3f} "
            f"while the train loss is {train_loss:.3f}", measured,
            "The model memorises the training images; ViTs do so fast on small data.", fix)
    if memorised:
        return Finding(
            "run.overfitting", "warning",
            f"memorising: a train loss of {train_loss:.3f} against a validation loss of "
            f"{val_loss:.3f} ({val_loss / max(train_loss, 1e-12):.0f}x)", measured,
            "The model fits its training images far better than any other: it has memorised "
            "them, and more epochs will not help the validation score.", fix)
    return Finding("run.overfitting", "ok", "no sign of overfitting", measured)


def check_stability(run: Run, ctx: dict) -> Finding | None:
    """A non-finite loss (error), or spikes above SPIKE x the running median (warning)."""
    ended = run.result or {}
    stopped = ended.get("stopped") == "non-finite"
    bad = [(int(r.get("epoch") or i + 1), k) for i, r in enumerate(run.metrics)
           for k in ("train_loss", "val_loss")
           if r.get(k) is not None and not math.isfinite(r[k])]
    if stopped or bad or run.non_finite:
        where = (f"at epochs {sorted({e for e, _ in bad})}" if bad else
                 f"({run.non_finite[0]})" if run.non_finite else
                 f"({ended.get('loss')}) at step {ended.get('step')} (epoch "
                 f"{ended.get('epoch')}) and the run stopped")
        return Finding(
            "run.stability", "error", f"the loss became non-finite {where}",
            {"non_finite": [f"epoch {e} {k}" for e, k in bad][:6]},
            "The run diverged: a learning rate too high, no warmup, float16 overflow or broken "
            "images.",
            "--lr lower, --warmup-epochs 5, --clip-grad 1.0; the last good checkpoint is "
            "last.safetensors")
    losses = [r["train_loss"] for r in run.metrics if r.get("train_loss") is not None]
    spikes = [i + 1 for i in range(1, len(losses))
              if losses[i] > SPIKE * statistics.median(losses[:i])]
    if spikes:
        return Finding(
            "run.stability", "warning",
            f"loss spikes above {SPIKE}x the running median at epochs {spikes}",
            {"epochs": spikes},
            "Spikes mean steps too large for the curvature: training is on the edge of "
            "diverging.", "--clip-grad 1.0, a longer --warmup-epochs, or --lr lower")
    if len(losses) >= 2:
        return Finding("run.stability", "ok", "no loss spikes", {"epochs": len(losses)})
    return None
