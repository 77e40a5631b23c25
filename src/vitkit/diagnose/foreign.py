"""Run folders of other training programs, read as a :class:`~vitkit.diagnose.runs.Run` in
vitkit's terms so the same run checks apply.

- **timm** ``train.py`` (``output/train/DATE-MODEL-SIZE``): ``args.yaml`` (its argparse options,
  written before the learning rate is resolved, so ``lr: null`` means ``lr_base`` scaled by
  the batch: linearly, or by its square root for Adam-like and LAMB optimizers) and
  ``summary.csv`` (``epoch`` from 0, ``train_loss``, ``eval_loss``, ``eval_top1`` in percent,
  ``eval_top5``, ``lr``; a resume may repeat the header).
- **Hugging Face Trainer** (``output_dir``): ``trainer_state.json`` (``log_history``: training
  entries with ``loss``, ``grad_norm``, ``learning_rate``; evaluation entries with ``eval_loss``
  and ``eval_<metric>``) at the top after ``save_state()``, else in the newest
  ``checkpoint-N/``, and the model's ``config.json``. Its training arguments are only in
  ``training_args.bin``, a pickle that is never loaded: the optimizer and whether the model
  was pre-trained are unknown, and the checks that need them say so.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import yaml

from vitkit.diagnose.run_folder import Run
from vitkit.errors import DataError

# timm's defaults where args.yaml leaves the rate unresolved (train.py: --lr-base 0.1 per 256)
TIMM_LR_BASE, TIMM_LR_BASE_SIZE = 0.1, 256


TIMM_CROP_SCALE = 0.08  # train.py's RandomResizedCrop scale (0.08, 1.0) unless --scale says


def kind(folder: Path) -> str | None:
    """"vitkit", "timm" or "hf" for a run folder of that program, else None."""
    if (folder / "config.yaml").is_file():
        return "vitkit"
    if (folder / "args.yaml").is_file() and (folder / "summary.csv").is_file():
        return "timm"
    if _trainer_state(folder) is not None:
        return "hf"
    return None


def _number(text) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except (TypeError, ValueError):
        return None


def read_timm(folder: Path):
    """A timm ``train.py`` output folder as a Run."""
    try:
        args = yaml.safe_load((folder / "args.yaml").read_text()) or {}
    except yaml.YAMLError as err:
        raise DataError(f"{folder}/args.yaml is not valid YAML: {err}") from err
    if not isinstance(args, dict):
        raise DataError(f"{folder}/args.yaml must hold timm's options as a mapping")
    metrics = []
    with open(folder / "summary.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row.get("epoch") in (None, "", "epoch"):  # a header repeated by a resume
                continue
            top1 = _number(row.get("eval_top1"))
            metrics.append({"epoch": (_number(row["epoch"]) or 0) + 1,
                            "train_loss": _number(row.get("train_loss")),
                            "val_loss": _number(row.get("eval_loss")),
                            "val_top1": top1 / 100 if top1 is not None else None,
                            "lr": _number(row.get("lr"))})
    opt = str(args.get("opt") or "sgd")
    lr = _number(args.get("lr"))
    note = ""
    if not lr:  # timm resolves it at start-up: lr_base x (global batch / lr_base_size)^(1 or .5)
        batch = (_number(args.get("batch_size")) or 128) * (
            _number(args.get("grad_accum_steps")) or 1)
        ratio = batch / (_number(args.get("lr_base_size")) or TIMM_LR_BASE_SIZE)
        scale = args.get("lr_base_scale") or (
            "sqrt" if any(o in opt.lower() for o in ("ada", "lamb")) else "linear")
        lr = (_number(args.get("lr_base")) or TIMM_LR_BASE) * (
            ratio ** 0.5 if scale == "sqrt" else ratio)
        seen = [m["lr"] for m in metrics if m.get("lr")]
        if seen and max(seen) > lr:  # more processes than one: summary.csv saw the real rate
            lr = max(seen)
        note = "lr resolved from lr_base as timm's train.py does (one process assumed)"
    config = {
        "model": args.get("model"), "opt": opt, "lr": lr,
        "weight_decay": args.get("weight_decay"), "warmup_epochs": args.get("warmup_epochs"),
        "epochs": args.get("epochs"), "clip_grad": args.get("clip_grad"),
        "mixup": args.get("mixup"), "cutmix": args.get("cutmix"),
        "randaugment": 9 if str(args.get("aa") or "").startswith("rand") else 0,
        # what raises the training loss (the learning check reads them): timm's names
        "label_smoothing": args.get("smoothing"), "drop_path": args.get("drop_path"),
        "random_erasing": args.get("reprob"),
        "crop_scale": (args.get("scale") or [TIMM_CROP_SCALE])[0],
        "init": args.get("initial_checkpoint") or None,
        "pretrained": bool(args.get("pretrained")),
    }
    classes = args.get("num_classes")
    return Run(folder, config, metrics, source="timm",
               classes_known=int(classes) if classes else None, notes=[note] if note else [])


def _trainer_state(folder: Path) -> Path | None:
    if (folder / "trainer_state.json").is_file():
        return folder / "trainer_state.json"
    checkpoints = sorted((p for p in folder.glob("checkpoint-*")
                          if re.fullmatch(r"checkpoint-\d+", p.name)
                          and (p / "trainer_state.json").is_file()),
                         key=lambda p: int(p.name.split("-")[1]))
    return checkpoints[-1] / "trainer_state.json" if checkpoints else None


def read_hf(folder: Path):
    """A Hugging Face Trainer output folder as a Run."""
    path = _trainer_state(folder)
    try:
        state = json.loads(path.read_text())  # NaN and Infinity as Python's json writes them
    except ValueError as err:
        raise DataError(f"{path} is not valid JSON: {err}") from err
    history = state.get("log_history") or []
    train = [h for h in history if "loss" in h]
    evals = [h for h in history if "eval_loss" in h]
    metrics = []
    for e in evals or train:  # one row per evaluation, with the last training loss before it
        before = [t for t in train if t.get("step", 0) <= e.get("step", 0)]
        last = before[-1] if before else {}
        accuracy = next((v for k, v in e.items() if k in ("eval_accuracy", "eval_top1")), None)
        metrics.append({"epoch": e.get("epoch"), "step": e.get("step"),
                        "train_loss": last.get("loss", e.get("loss")),
                        "val_loss": e.get("eval_loss"), "val_top1": accuracy})
    config_path = path.parent / "config.json" if (path.parent / "config.json").is_file() \
        else folder / "config.json"
    model_config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    labels = model_config.get("id2label") or {}
    rates = [h["learning_rate"] for h in history if "learning_rate" in h]
    config = {"model": model_config.get("model_type", "vit"), "opt": "unknown",
              "lr": max(rates) if rates else None,
              "epochs": state.get("num_train_epochs")}
    if rates and len(rates) > 1 and rates[0] < max(rates):
        config["warmup_steps"] = 1  # the rate rose first: a warmup
    # the Trainer logs a non-finite loss as the running mean of the ones before it; the
    # gradient norm is logged as it was
    bad = [f"grad_norm {g} at step {h.get('step')}" for h in history
           if isinstance(g := h.get("grad_norm"), (int, float)) and not math.isfinite(g)]
    return Run(folder, config, metrics, source="hf",
               classes_known=len(labels) or model_config.get("num_labels"),
               unknown=frozenset({"optimizer", "init"}), non_finite=bad,
               notes=["the optimizer and any pre-training are unknown: the Trainer keeps its "
                      "arguments only in training_args.bin, a pickle vitkit never loads"])
