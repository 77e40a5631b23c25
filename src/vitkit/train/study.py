"""The data-size study: the article's four training claims, measured with ``vitkit train``.

(a) and (c): a plain ViT, a ViT with DeiT-style augmentation, a ViT distilled from the CNN,
ResNet-18 and a narrow ResNet-18 of about the ViT's compute, on nested subsets of the target
data, several seeds per point.
(b): both the ViT and the CNN pre-trained once on a disjoint source set, then fine-tuned on each
subset, against the same models from scratch.
(d): the ViT trained on the whole target at one size, then fine-tuned at twice the size (the
patch grid doubles, the position table is interpolated), against more training at the low size
for the same steps, and against the interpolated table without fine-tuning.

Every run is one call of :func:`vitkit.train.trainer.train`. The budget rule is equal epochs
with a floor: ``steps = max(min_steps, ceil(epochs * images / batch))``, the first tenth of
them (``warmup``) a linear warmup. The augmentation of
the DeiT arm is chosen by a stated sweep (light or heavy, scaled for small images: see
``AUGMENTATION``) at the largest subset with seed 0, then used at every size. Each finished run
leaves its row in ``OUT/results/NAME.json`` (a rerun skips it), and weights are kept only while
a later run needs them (teacher, pre-trained source, low-resolution model) unless
``keep_checkpoints``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from vitkit.data.datasets import load_split
from vitkit.data.idx import find_idx_folder
from vitkit.errors import ConfigError, LockHeld, WorkerFailed
from vitkit.recipe import study_base, study_budget, study_converge
from vitkit.train import resume as resume_io
from vitkit.train import runfolder
from vitkit.train.config import resolve
from vitkit.train.evaluate import evaluate_checkpoint
from vitkit.train.trainer import train
from vitkit.util.files import atomic_write
from vitkit.util.numbers import check_counts, check_number

log = logging.getLogger("vitkit")

# The DeiT recipe is tuned for 224px ImageNet and 300 epochs: a crop keeping 8% of a 16-pixel
# digit, or RandAugment at magnitude 9, destroys the label. Scaled for small images and short
# budgets (Steiner et al. 2021 sweep none / light / heavy the same way): crops keep at least
# half (light: 80%) of the image, RandAugment at a third (light: a fifth) of the DeiT magnitude,
# MixUp/CutMix only in "heavy", no flips (digits are not symmetric).
AUGMENTATION: dict[str, dict] = {
    "light": dict(crop_scale=0.8, randaugment=2, mixup=0.2, cutmix=0.0, random_erasing=0.1,
                  label_smoothing=0.1, drop_path=0.05),
    "heavy": dict(crop_scale=0.5, randaugment=3, mixup=0.8, cutmix=1.0, random_erasing=0.25,
                  label_smoothing=0.1, drop_path=0.1),
}

# name -> (label, claim, options on top of the base); the CNNs are the teachers and baselines
ARMS: dict[str, tuple[str, str, dict]] = {
    "cnn": ("ResNet-18", "a", dict(model="resnet18")),
    "cnn-small": ("ResNet-18, width 24 (about the ViT's FLOPs)", "a",
                  dict(model="resnet18_w24")),
    "vit": ("ViT (plain)", "a", dict()),
    "vit-deit": ("ViT + augmentation (DeiT-style, swept)", "c", dict()),
    "vit-distilled": ("ViT distilled from ResNet-18", "c", dict(distill="hard")),
    "vit-soft": ("ViT soft-distilled from ResNet-18", "c", dict(distill="soft")),
    "vit-pretrained": ("ViT pre-trained on the source", "b", dict(recipe="plain")),
    "cnn-pretrained": ("ResNet-18 pre-trained on the source", "b", dict(model="resnet18")),
    "source-vit": ("ViT on the source (pre-training)", "b", dict()),
    "source-cnn": ("ResNet-18 on the source (pre-training)", "b", dict(model="resnet18")),
    "sweep-light": ("ViT + light augmentation (sweep)", "c", dict()),
    "sweep-heavy": ("ViT + heavy augmentation (sweep)", "c", dict()),
    "res-low": ("ViT at the low size (more steps)", "d", dict()),
    "res-2x": ("ViT fine-tuned at 2x, table interpolated", "d", dict()),
    "res-naive": ("ViT at 2x, table interpolated, not fine-tuned", "d", dict()),
}
FINETUNE_LR = 0.25  # fine-tuning runs (pre-trained arms, claim (d)) use this share of --lr

# The committed run: Fashion-MNIST classes 5-9 (sandal, shirt, sneaker, bag, ankle boot;
# 30,000 training images) as the target, classes 0-4 as the disjoint pre-training source.
FULL_PLAN = dict(data="fashion-mnist:5-9", source="fashion-mnist:0-4",
            fractions=(0.01, 0.05, 0.2, 1.0), seeds=3, epochs=10.0, min_steps=80,
            max_steps=150, source_steps=400, resolution_steps=150)
QUICK_PLAN = dict(fractions=(0.1, 0.3, 1.0), seeds=2, epochs=5.0, min_steps=60, source_steps=200,
             resolution_steps=60)
# The converged run (issue 26): the same target and source, every run trained until its
# validation loss (on 5% of the training split held out) has not improved for 5 epochs, at
# most 40 epochs (20 on the source, 5 extra for claim (d)); sizes where a ViT can overfit;
# both distillations, from the CNN of the ViT's compute. ResNet-18 (7x the ViT's compute per
# step) is the baseline at the smaller size only, so the run fits about two hours on 2 cores.
CONVERGED_PLAN = dict(data="fashion-mnist:5-9", source="fashion-mnist:0-4",
                      fractions=(0.05, 0.2), seeds=3, budget="converge", patience=5,
                      max_epochs=40, holdout=0.05, source_epochs=20, resolution_epochs=5,
                      distill=("hard", "soft"), teacher="cnn-small", pretrained_cnn="cnn-small",
                      cnn_fractions=(0.05,), out="runs/study-converged")
BUDGETS = ("steps", "converge")
TEACHERS = ("cnn", "cnn-small")


@dataclass
class StudyPlan:
    """What the study runs. ``source``: the pre-training data (None: no claim (b));
    ``resolution``: run claim (d)."""

    data: str = "digits"
    img_size: int = 16
    vit: str = "vit_micro_patch4_32"
    cnn: str = "resnet18"  # the baseline and teacher
    cnn_small: str = "resnet18_w24"  # a CNN of about the ViT's compute
    fractions: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0)
    seeds: int = 2
    epochs: float = 10.0
    min_steps: int = 150
    max_steps: int = 0  # > 0: a cap, so the largest subsets fit the time there is
    batch_size: int = 64
    lr: float = 8e-3
    warmup: float = 0.1  # share of every run's steps spent in linear warmup
    source: str | None = None
    source_steps: int = 1500
    resolution: bool = True
    resolution_steps: int = 300
    augmentation: str = "sweep"  # sweep | light | heavy
    # budget "converge": every run until its validation loss (on ``holdout`` of the training
    # split) has not improved for ``patience`` epochs, at most ``max_epochs`` (pre-training at
    # most ``source_epochs``); claim (d) trains ``resolution_epochs`` more epochs
    budget: str = "steps"  # steps | converge
    patience: int = 5
    max_epochs: int = 60
    holdout: float = 0.05
    source_epochs: int = 30
    resolution_epochs: int = 15
    anneal_epochs: int = 0  # converge: once patience runs out, anneal for this many epochs
    distill: tuple[str, ...] = ("hard",)  # the distilled arms: hard and/or soft
    distill_tau: float = 3.0  # the soft arm's temperature (DeiT's)
    teacher: str = "cnn"  # the distillation teacher: cnn (--cnn) or cnn-small (--cnn-small)
    pretrained_cnn: str = "cnn"  # the CNN claim (b) pre-trains: cnn or cnn-small
    cnn_fractions: tuple[float, ...] = ()  # where --cnn trains when not the teacher (): all
    device: str = "auto"
    out: str = "runs/study"
    keep_checkpoints: bool = False
    extra: dict = field(default_factory=dict)  # any TrainConfig option for every run

    def check(self) -> None:
        check_counts((name, getattr(self, name)) for name in (
            "seeds", "batch_size", "img_size", "min_steps", "source_steps", "resolution_steps"))
        check_number("--epochs", self.epochs, positive=True)
        check_number("--lr", self.lr, positive=True)
        check_number("--max-steps", self.max_steps, least=0, zero_means="no cap")
        if not 0 <= self.warmup < 1:  # NaN fails too
            raise ConfigError(f"--warmup is a share of each run's steps in [0, 1), got "
                              f"{self.warmup}")
        if not self.fractions or not all(0 < f <= 1 for f in self.fractions):
            raise ConfigError(f"--fractions must be shares in (0, 1], got {list(self.fractions)}")
        if self.augmentation not in ("sweep", *AUGMENTATION):
            raise ConfigError(f"--augmentation must be sweep, light or heavy, got "
                              f"{self.augmentation!r}")
        if self.budget not in BUDGETS:
            raise ConfigError(f"--budget must be steps or converge, got {self.budget!r}")
        check_number("--anneal-epochs", self.anneal_epochs, least=0)
        check_counts((name, getattr(self, name)) for name in (
            "patience", "max_epochs", "source_epochs", "resolution_epochs"))
        if not 0 < self.holdout <= 0.5:
            raise ConfigError(f"--holdout is the share of the training split held out to "
                              f"stop on, in (0, 0.5], got {self.holdout}")
        if not self.distill or set(self.distill) - {"hard", "soft"}:
            raise ConfigError(f"--distill takes hard and/or soft, got {list(self.distill)}")
        check_number("--distill-tau", self.distill_tau, positive=True)
        if self.teacher not in TEACHERS:
            raise ConfigError(f"--teacher must be cnn or cnn-small, got {self.teacher!r}")
        if set(self.cnn_fractions) - set(self.fractions):
            raise ConfigError(f"--cnn-fractions must be among --fractions "
                              f"{list(self.fractions)}, got {list(self.cnn_fractions)}")
        if self.pretrained_cnn not in TEACHERS:
            raise ConfigError(f"--pretrained-cnn must be cnn or cnn-small, got "
                              f"{self.pretrained_cnn!r}")

    def steps(self, images: int) -> int:
        """The budget rule: equal epochs, with a floor of ``min_steps`` (and a cap of
        ``max_steps`` when set); the same for every arm at a given size."""
        steps = max(self.min_steps, math.ceil(self.epochs * images / self.batch_size))
        return min(steps, self.max_steps) if self.max_steps else steps

    def schedule(self, steps: int) -> dict:
        """A run's ``steps`` with its warmup, as every study run has it
        (:func:`vitkit.recipe.study_budget`)."""
        return study_budget(steps, self.warmup)

    def converge(self, epochs: int, patience: bool = True) -> dict:
        """A converge-budget run of at most ``epochs`` epochs, stopped on ``patience``
        (:func:`vitkit.recipe.study_converge`) or run to the end."""
        return study_converge(epochs, self.patience if patience else 0, self.holdout,
                              self.warmup, self.anneal_epochs)

    @property
    def converging(self) -> bool:
        return self.budget == "converge"

    @property
    def rule(self) -> str:
        """The budget rule in words (plan.json, reports)."""
        if self.converging:
            return (f"until the validation loss on {self.holdout:.0%} of the training split "
                    f"(held out) has not improved for {self.patience} epochs, at most "
                    f"{self.max_epochs} epochs (pre-training at most {self.source_epochs}); "
                    f"batch {self.batch_size}, the first {self.warmup:.0%} of the maximum a "
                    "warmup, the best epoch kept, the validation split evaluated once on it; "
                    "the same for every arm")
        cap = f", at most {self.max_steps}" if self.max_steps else ""
        return (f"{self.epochs:g} epochs of the subset, at least {self.min_steps} steps{cap}, "
                f"batch {self.batch_size}, {self.warmup:.0%} of them warmup, the same for "
                "every arm")


def arm_label(arm: str, plan: StudyPlan) -> str:
    """The arm's name in reports, with the plan's CNNs named when they are not the defaults
    (the distilled arms name their teacher, the pre-trained CNN arm its CNN)."""
    small = "ResNet-18, width 24" if plan.cnn_small == "resnet18_w24" else plan.cnn_small
    text = ARMS[arm][0]
    if arm == "cnn-small":
        return text if plan.cnn_small == "resnet18_w24" else f"{plan.cnn_small} (small CNN)"
    if (arm in ("vit-distilled", "vit-soft") and plan.teacher == "cnn-small") or (
            arm in ("cnn-pretrained", "source-cnn") and plan.pretrained_cnn == "cnn-small"):
        return text.replace("ResNet-18", small)
    return text.replace("ResNet-18", plan.cnn) if plan.cnn != "resnet18" else text


def _base(plan: StudyPlan) -> dict:
    """The options every run of the data study shares (its budget comes with each run)."""
    return study_base(data=plan.data, img_size=plan.img_size, model=plan.vit,
                      batch_size=plan.batch_size, lr=plan.lr, out=plan.out, device=plan.device,
                      **plan.extra)


WEIGHTS = ("best.safetensors", "last.safetensors", "state.pt")


def drop_weights(run_dir: Path) -> None:
    """Remove a finished run's weights and resume state; config, log and metrics stay."""
    for name in WEIGHTS:
        (run_dir / name).unlink(missing_ok=True)


def _clock(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


POLL = 5.0  # seconds between looks at a run another worker is training


class Study:
    """Runs the plan, resuming from ``OUT/results``; ``say`` prints progress.

    ``worker=(k, n)``: this process is worker ``k`` of ``n`` on the same ``OUT``. Each run is
    claimed (``OUT/claims/NAME``, a lock naming the process) before it trains, so no two
    workers train the same run; a worker skips a run another one holds (and the runs that need
    its result: students wait for their teacher, the augmented arm for the sweep, fine-tuning
    for its source) and comes back to them.
    Worker ``k`` starts at the ``k``-th share of the (seed, subset) points, so the workers
    meet only at the end. A worker that dies leaves its claim to be taken over.
    """

    def __init__(self, plan: StudyPlan, say: Callable[[str], None] = log.info,
                 worker: tuple[int, int] = (0, 1)) -> None:
        plan.check()
        self.plan, self.say = plan, say
        self.out = Path(plan.out)
        self.worker, self.workers = worker
        self.seen: dict[str, dict] = {}  # run name -> its row, each counted once
        self.total = self.done = 0
        self.spent, self.trained, self.start = 0.0, 0, time.perf_counter()
        # the DeiT arm's augmentation: chosen by sweep() unless the plan names it
        self.level: str | None = None if plan.augmentation == "sweep" else plan.augmentation
        self.sweep_scores: dict[str, float] | None = None  # the sweep's top-1 per level

    @property
    def rows(self) -> list[dict]:
        return list(self.seen.values())

    # ------------------------------------------------------------------ bookkeeping
    def _record_path(self, name: str) -> Path:
        return self.out / "results" / f"{name}.json"

    def finished(self, name: str) -> dict | None:
        path = self._record_path(name)
        try:
            return json.loads(path.read_text()) if path.exists() else None
        except (OSError, ValueError):
            return None  # a damaged record: run it again

    def weights(self, name: str) -> Path:
        return self.out / name / "best.safetensors"

    def _take(self, name: str, row: dict, seconds: float | None) -> dict:
        """Count ``row`` (once per run) and say so."""
        if name not in self.seen:
            self.seen[name] = row
            self._progress(row, seconds)
        return row

    def _usable(self, name: str, needed_later: bool) -> dict | None:
        """The run's recorded row, unless its weights are needed and gone."""
        done = self.finished(name)
        if done is not None and not (needed_later and not self.weights(name).exists()):
            return done
        return None

    def _claim(self, name: str) -> runfolder.RunLock | None:
        """This worker's claim on training ``name``, or None while another worker holds it."""
        folder = self.out / "claims" / name
        folder.mkdir(parents=True, exist_ok=True)
        try:
            return runfolder.lock(folder)
        except LockHeld:  # another worker holds it: busy, not a mistake
            return None

    def label(self, arm: str) -> str:
        """The arm's name in progress lines."""
        return arm_label(arm, self.plan)

    def claim(self, arm: str) -> str:
        """The claim, (a) to (d), an arm's row speaks to."""
        return ARMS[arm][1] if arm in ARMS else ""

    def _progress(self, row: dict, seconds: float | None) -> None:
        self.done += 1
        label = self.label(row["arm"])
        what = f"[{self.done}/{self.total}] {label}, {row.get('fraction', 1):.0%}"
        if seconds is None:
            self.say(f"{what}, seed {row['seed']}: done before (top-1 {row['top1']:.4f})")
            return
        if not row["arm"].startswith("source-"):  # the one-off pre-training runs are longer
            self.spent, self.trained = self.spent + seconds, self.trained + 1
        self.say(f"{what} ({row['images']} images), seed {row['seed']}: top-1 "
                 f"{row['top1']:.4f} in {_clock(seconds)}; "
                 f"{_clock(time.perf_counter() - self.start)} elapsed, {self._left()}")

    def _left(self) -> str:
        """The time left in words: the runs left at the mean of the target runs so far, shared
        by the workers; unknown until one has finished (a pre-training run is no measure)."""
        if not self.trained:
            return "the time left is known after the first run on the target"
        left = (self.total - self.done) * self.spent / self.trained / self.workers
        return f"about {_clock(left)} left"

    def run_one(self, name: str, arm: str, seed: int, fraction: float, options: dict,
                needed_later: bool = False) -> dict | None:
        """Train one run (or take its recorded row); keep its weights if ``needed_later``.
        None when another worker is training it."""
        done = self._usable(name, needed_later)
        if done is not None:
            return self._take(name, done, None)
        held = self._claim(name)
        if held is None:
            return None
        try:
            done = self._usable(name, needed_later)  # another worker may have just finished it
            if done is not None:
                return self._take(name, done, None)
            return self._train(name, arm, seed, fraction, options, needed_later)
        finally:
            held.release()
            with contextlib.suppress(OSError):
                held.path.parent.rmdir()  # the claim's folder, now empty

    def _train(self, name: str, arm: str, seed: int, fraction: float, options: dict,
               needed_later: bool) -> dict:
        cfg = resolve({**_base(self.plan), **options, "data_fraction": fraction, "seed": seed,
                       "name": name})
        start = time.perf_counter()
        result = train(cfg, resume=self._interrupted(name, cfg))
        seconds = time.perf_counter() - start
        row = dict(arm=arm, claim=self.claim(arm), fraction=fraction,
                   images=result.train_images, seed=seed, top1=result.history[-1]["val_top1"],
                   best_top1=result.best_top1, steps=result.history[-1]["step"],
                   img_size=cfg.img_size, model=cfg.model, seconds=round(seconds, 1))
        if result.outcome is not None:  # converge budget: the best epoch on the val split
            o = result.outcome
            row.update(top1=o.get("test_top1", row["top1"]), steps=o["steps"],
                       epochs=o["epochs"], max_epochs=o["max_epochs"], stopped=o["stopped"],
                       best_epoch=o["best_epoch"], train_top1=o.get("train_top1"),
                       annealed=o.get("annealed", False), val_loss=o["best_val_loss"])
        (self.out / "results").mkdir(parents=True, exist_ok=True)
        atomic_write(self._record_path(name), lambda tmp: tmp.write_text(json.dumps(row)))
        if not needed_later and not self.plan.keep_checkpoints:
            drop_weights(result.run_dir)
        return self._take(name, row, seconds)

    def _interrupted(self, name: str, cfg) -> Path | None:
        """The folder of a run of this study that stopped before its record, when it can be
        resumed (its state saved, its config this plan's): the run continues where it stopped
        (early-stopping state included), so an interrupted hour-long pre-training loses at
        most an epoch. Any other leftover is removed and the run starts again."""
        folder = self.out / name
        if not folder.exists():
            return None
        if self.finished(name) is not None:  # trained again for its weights, gone: from scratch
            shutil.rmtree(folder)
            return None
        if resume_io.leftover(folder, cfg) is not None:
            self.say(f"{name} stopped before it finished: resuming it")
            return folder
        self.say(f"{name} stopped before it finished: training it again")
        return None

    @property
    def pretrained_cnn(self) -> str:
        return self.plan.cnn if self.plan.pretrained_cnn == "cnn" else self.plan.cnn_small

    def release(self, name: str) -> None:
        if not self.plan.keep_checkpoints:
            drop_weights(self.out / name)

    # --------------------------------------------------------------------- the study
    @functools.cached_property
    def train_images(self) -> int:
        """The size of the target's training split (read once)."""
        return len(load_split(self.plan.data, "train", self.plan.img_size,
                              root=self.plan.extra.get("data_root", "data")))

    def subset_images(self, fraction: float) -> int:
        return max(1, round(fraction * self.train_images))

    def run(self) -> list[dict]:
        p = self.plan
        fractions = sorted(p.fractions)
        per_point = 3 + len(p.distill) + (2 if p.source else 0)
        cnn_points = len([f for f in fractions if p.teacher == "cnn" or not p.cnn_fractions
                          or f in p.cnn_fractions])
        self.total = (len(fractions) * p.seeds * per_point + cnn_points * p.seeds
                      + (2 if p.source else 0)
                      + (2 if p.augmentation == "sweep" else 0)
                      + (2 * p.seeds if p.resolution else 0))
        self.sweep()  # the shared runs first: a worker skips one another worker holds
        self.pretrain()
        items = []
        for seed in range(p.seeds):
            items += [functools.partial(self.point, f, seed) for f in fractions]
            if p.resolution:
                items.append(functools.partial(self.resolution, seed))
        first = len(items) * self.worker // self.workers  # each worker starts elsewhere
        pending = items[first:] + items[:first]
        while pending:  # an item another worker holds a run of is come back to
            left = [item for item in pending if not item()]
            if len(left) == len(pending):
                time.sleep(POLL)
            pending = left
        for arm, name in self.pretrain().items():
            if all(self.finished(f"{arm}-f{f:g}-s{s}") is not None for f in fractions
                   for s in range(p.seeds)):
                self.release(name)
        return self.rows

    def _steps(self, fraction: float) -> dict:
        """The budget of a run on the subset ``fraction``."""
        if self.plan.converging:
            return self.plan.converge(self.plan.max_epochs)
        return self.plan.schedule(self.plan.steps(self.subset_images(fraction)))

    def sweep(self) -> str | None:
        """Light or heavy augmentation for the DeiT arm, chosen at the largest subset, seed 0
        (kept in ``self.level``); None while another worker trains one of the two."""
        if self.level is not None:
            return self.level
        fraction = max(self.plan.fractions)
        rows = {level: self.run_one(f"sweep-{level}", f"sweep-{level}", 0, fraction,
                                    {**AUGMENTATION[level], **self._steps(fraction)})
                for level in self._mine(list(AUGMENTATION))}  # workers start apart
        if None in rows.values():
            return None
        # converge budget: chosen on the held-out images, never on the validation split
        scores = {level: rows[level]["best_top1" if self.plan.converging else "top1"]
                  for level in AUGMENTATION}
        best = max(scores, key=scores.get)
        self.sweep_scores = scores
        on = "held-out top-1" if self.plan.converging else "top-1"
        self.say(f"augmentation sweep at {fraction:.0%} ({on}): " + ", ".join(
            f"{k} {v:.4f}" for k, v in scores.items()) + f"; the DeiT arm uses {best}")
        self.level = best
        return best

    def pretrain(self) -> dict[str, str]:
        """The ViT and the CNN trained once on the source -> {fine-tuned arm: run name}, for
        those trained (not those another worker is training); {} without a source."""
        names = {}
        if not self.plan.source:
            return names
        fractions, seeds = sorted(self.plan.fractions), range(self.plan.seeds)
        for arm, source, model in self._mine([
                ("vit-pretrained", "source-vit", self.plan.vit),
                ("cnn-pretrained", "source-cnn", self.pretrained_cnn)]):
            later = any(self.finished(f"{arm}-f{f:g}-s{s}") is None
                        for f in fractions for s in seeds)
            budget = (self.plan.converge(self.plan.source_epochs)
                      if self.plan.converging else self.plan.schedule(self.plan.source_steps))
            if self.run_one(source, source, 0, 1.0,
                            dict(data=self.plan.source, model=model, **budget),
                            needed_later=later) is not None:
                names[arm] = source
        return {arm: names[arm] for arm in ("vit-pretrained", "cnn-pretrained") if arm in names}

    def _mine(self, things: list) -> list:
        """``things`` in this worker's order: worker k starts at the k-th."""
        k = self.worker % len(things)
        return things[k:] + things[:k]

    def point(self, fraction: float, seed: int) -> bool:
        """Every arm at one subset and seed: the teacher first, ResNet-18 last when it is not
        the teacher (it costs the most, so an interrupted study has the ViT arms first).
        False while another worker holds one of its runs."""
        tag = f"f{fraction:g}-s{seed}"
        steps = self._steps(fraction)
        keep_vit = self.plan.resolution and fraction == max(self.plan.fractions) and any(
            self.finished(f"res-{k}-s{seed}") is None for k in ("low", "2x", "naive"))
        students = {"hard": "vit-distilled", "soft": "vit-soft"}
        students = [students[mode] for mode in self.plan.distill]
        cnns = {"cnn": self.plan.cnn, "cnn-small": self.plan.cnn_small}
        teacher = self.plan.teacher
        if self.run_one(f"{teacher}-{tag}", teacher, seed, fraction,
                        {"model": cnns[teacher], **steps},
                        needed_later=any(self.finished(f"{s}-{tag}") is None
                                         for s in students)) is None:
            return False  # the students need it: come back once it is trained
        level = self.sweep()  # None while another worker holds a sweep run
        rows = [self.run_one(f"vit-{tag}", "vit", seed, fraction, steps, needed_later=keep_vit),
                level and self.run_one(f"vit-deit-{tag}", "vit-deit", seed, fraction,
                                       {**AUGMENTATION[level], **steps})]
        for student in students:
            rows.append(self.run_one(
                f"{student}-{tag}", student, seed, fraction,
                {**ARMS[student][2], "teacher": str(self.weights(f"{teacher}-{tag}")),
                 "distill_tau": self.plan.distill_tau if student == "vit-soft" else 1.0,
                 **steps}))
        if all(self.finished(f"{s}-{tag}") is not None for s in students):
            self.release(f"{teacher}-{tag}")
        sources = self.pretrain()
        if self.plan.source and len(sources) < 2:
            rows.append(None)  # a source another worker is training: come back later
        for arm, name in sources.items():
            model = self.plan.vit if arm == "vit-pretrained" else self.pretrained_cnn
            rows.append(self.run_one(f"{arm}-{tag}", arm, seed, fraction,
                                     dict(model=model, init=str(self.weights(name)),
                                          lr=self.plan.lr * FINETUNE_LR, **steps)))
        other = "cnn-small" if teacher == "cnn" else "cnn"
        if other == "cnn-small" or not self.plan.cnn_fractions or \
                fraction in self.plan.cnn_fractions:
            rows.append(self.run_one(f"{other}-{tag}", other, seed, fraction,
                                     {"model": cnns[other], **steps}))
        return all(row is not None for row in rows)

    def resolution(self, seed: int) -> bool:
        """Claim (d) on the whole largest subset: the low-size ViT, more of it, 2x fine-tuned,
        and its interpolated table without fine-tuning. False while the low-size ViT, or one
        of these runs, is another worker's."""
        fraction = max(self.plan.fractions)
        low = f"vit-f{fraction:g}-s{seed}"
        pending = [k for k in ("low", "2x", "naive") if self.finished(f"res-{k}-s{seed}") is None]
        if self.run_one(low, "vit", seed, fraction, self._steps(fraction),
                        needed_later=bool(pending)) is None:
            return False
        init = str(self.weights(low))
        budget = (self.plan.converge(self.plan.resolution_epochs, patience=False)
                  if self.plan.converging
                  else self.plan.schedule(self.plan.resolution_steps))
        steps = dict(budget, lr=self.plan.lr * FINETUNE_LR)
        rows = [self.run_one(f"res-low-s{seed}", "res-low", seed, fraction,
                             dict(init=init, **steps)),
                self.run_one(f"res-2x-s{seed}", "res-2x", seed, fraction,
                             dict(init=init, img_size=2 * self.plan.img_size, **steps))]
        naive = f"res-naive-s{seed}"
        row = self.finished(naive)
        if row is None:
            result = evaluate_checkpoint(init, self.plan.data, "val",
                                         img_size=2 * self.plan.img_size,
                                         root=self.plan.extra.get("data_root", "data"))
            row = dict(arm="res-naive", claim="d", fraction=fraction,
                       images=self.finished(low)["images"], seed=seed, top1=result["top1"],
                       best_top1=result["top1"], steps=0, img_size=2 * self.plan.img_size,
                       model=self.plan.vit, seconds=0.0)
            atomic_write(self._record_path(naive), lambda tmp: tmp.write_text(json.dumps(row)))
            self.say(f"ViT of seed {seed} at {2 * self.plan.img_size}px, table interpolated, "
                     f"not fine-tuned: top-1 {row['top1']:.4f}")
        self.seen.setdefault(naive, row)
        if None in rows:
            return False
        self.release(low)
        return True


def default_source(data: str) -> str | None:
    """Fashion-MNIST for the digits when its files are installed (a disjoint source)."""
    if not data.startswith("digits"):
        return None
    try:
        find_idx_folder("fashion-mnist", "data")
    except ValueError:
        return None
    return "fashion-mnist"


def plan_dict(plan: StudyPlan) -> dict:
    """The plan as stored beside the results (the budget rule that ran, in words too)."""
    return {**asdict(plan), "budget_rule": plan.rule, "augmentation_levels": AUGMENTATION}


def plan_from_file(path: str | Path, cls: type = StudyPlan) -> StudyPlan:
    """The plan a study wrote to ``OUT/plan.json`` (``cls``: a StudyPlan or a subclass)."""
    stored = json.loads(Path(path).read_text())
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()
                  if k in cls.__dataclass_fields__})


def run_workers(plan: StudyPlan, workers: int, say: Callable[[str], None] = log.info,
                study: type = Study, module: str = "vitkit.train.study") -> Study:
    """Run the plan on ``workers`` processes that share the cores: this process is worker 0,
    each other one a ``python -m MODULE`` (``study``'s own: this one for the data study) on the
    plan in ``OUT/plan.json``. On 2
    cores two single-threaded workers train about twice the runs per hour of one process
    with two threads (a small ViT's step does not speed up with a second thread). Returns
    this process's :class:`Study` once every run of the plan has its row."""
    check_number("--workers", workers)
    threads = max(1, (os.cpu_count() or 1) // workers)
    torch.set_num_threads(threads)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    children = [subprocess.Popen([sys.executable, "-m", module,
                                  str(Path(plan.out) / "plan.json"), str(k), str(workers)],
                                 env=env) for k in range(1, workers)]
    study = study(plan, say=lambda text: say(f"worker 0: {text}"), worker=(0, workers))
    try:
        study.run()
    finally:
        codes = [child.wait() for child in children]
    failed = [f"worker {k} (exit code {code})" for k, code in enumerate(codes, 1) if code]
    if failed:
        raise WorkerFailed(f"{', '.join(failed)} stopped; every finished run is kept: run the "
                          "same command again to resume")
    return study


if __name__ == "__main__":  # one worker of run_workers: PLAN_JSON K N
    _plan, _k, _n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    # the worker's lines on stderr, as the first worker's (the vitkit log, as the CLI shows it)
    logging.basicConfig(level=logging.INFO, format="vitkit: %(message)s", stream=sys.stderr)
    Study(plan_from_file(_plan), say=lambda text: log.info(f"worker {_k}: {text}"),
          worker=(_k, _n)).run()
