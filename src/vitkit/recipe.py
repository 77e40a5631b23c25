"""The run recipe: how a training configuration becomes the numbers a run uses. One rule per
fact, with no dependency on the rest of vitkit, so the trainer, the study (both modes) and the
doctor all call the same functions instead of restating them.

- the learning rate is given for a global batch of :data:`BASE_BATCH` images and scaled
  linearly: ``lr x batch_size x processes x accum_steps / 512`` (Goyal et al. 2017; DeiT);
- an epoch is whole global batches only (the trainer drops the rest);
- the schedule is a linear warmup to the peak, then a cosine to ``min_lr``;
- a study run has a fixed step budget, a tenth of it warmup, and evaluates once at the end;
  or, to convergence, a maximum of epochs, a tenth of it warmup, early stopping on a held-out
  share of the training split.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

BASE_BATCH = 512  # the global batch the configured learning rate is for
# vitkit train's defaults, read by the trainer's config, the plan and the doctor alike
DEFAULT_BATCH_SIZE = 64  # images per process per micro-step
DEFAULT_LR = 5e-4  # per BASE_BATCH images (DeiT's AdamW rate)
STUDY_WARMUP = 0.1  # share of every study run's steps spent in linear warmup
EVAL_AT_END = 10**6  # eval_every for study runs: tiny subsets make many tiny epochs


def global_batch(batch_size: int, world: int = 1, accum_steps: int = 1) -> int:
    """Images per optimizer step: per-process batch x processes x accumulation steps."""
    return batch_size * world * accum_steps


def scaled_lr(lr: float, batch_size: int, world: int = 1, accum_steps: int = 1) -> float:
    """The peak learning rate of a run whose ``lr`` is given per :data:`BASE_BATCH` images."""
    return lr * global_batch(batch_size, world, accum_steps) / BASE_BATCH


def steps_per_epoch(images: int, batch_size: int, accum_steps: int = 1, world: int = 1) -> int:
    """Optimizer steps in one epoch: whole global batches only (the trainer drops the rest)."""
    return images // (batch_size * world) // accum_steps


def schedule(per_epoch: int, steps: int = 0, epochs: float = 0, warmup_steps: int = 0,
             warmup_epochs: float = 0.0) -> tuple[int, int]:
    """(optimizer steps, warmup steps) of a run of ``per_epoch`` steps an epoch: ``steps`` when
    set, else ``epochs`` epochs; ``warmup_steps`` when set, else ``warmup_epochs`` epochs."""
    total = steps if steps > 0 else int(epochs * per_epoch)
    warmup = warmup_steps if warmup_steps > 0 else int(warmup_epochs * per_epoch)
    return total, warmup


def cosine_lr(step: int, total: int, warmup: int, base: float, floor: float = 0.0) -> float:
    """Linear warmup from ~0 to ``base`` over ``warmup`` steps, then cosine down to ``floor``."""
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return floor + (base - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


@dataclass(frozen=True)
class RunPlan:
    """The resolved numbers of one training run: what the trainer uses and the doctor judges.
    The trainer writes it to ``run.json`` in the run folder."""

    train_images: int
    classes: int
    world: int  # processes
    global_batch: int
    lr: float  # the peak learning rate, after scaling
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    epochs: int

    def to_dict(self) -> dict:
        return asdict(self)


def plan_run(config: Mapping, train_images: int, classes: int, world: int = 1) -> RunPlan:
    """The :class:`RunPlan` of a vitkit training ``config`` (a ``TrainConfig.to_dict()`` or any
    mapping with its keys) on ``train_images`` images, over ``world`` processes."""
    batch = int(config.get("batch_size", DEFAULT_BATCH_SIZE))
    accum = int(config.get("accum_steps", 1) or 1)
    per_epoch = steps_per_epoch(train_images, batch, accum, world)
    steps, epochs = int(config.get("steps") or 0), config.get("epochs") or 0
    total, warmup = schedule(per_epoch, steps, epochs, int(config.get("warmup_steps") or 0),
                             float(config.get("warmup_epochs") or 0.0))
    run_epochs = math.ceil(steps / per_epoch) if steps > 0 and per_epoch else int(epochs)
    return RunPlan(train_images=train_images, classes=classes, world=world,
                   global_batch=global_batch(batch, world, accum),
                   lr=scaled_lr(float(config.get("lr", DEFAULT_LR)), batch, world, accum),
                   steps_per_epoch=per_epoch, total_steps=total, warmup_steps=warmup,
                   epochs=run_epochs)


def study_warmup(steps: int, share: float = STUDY_WARMUP) -> int:
    """Warmup steps of a study run of ``steps`` steps: ``share`` of them, at least one when
    ``share`` is set."""
    return max(1, round(share * steps)) if share > 0 else 0


def study_budget(steps: int, warmup: float = STUDY_WARMUP) -> dict:
    """A study run's budget: ``steps`` optimizer steps, ``warmup`` of them linear warmup."""
    return {"steps": steps, "warmup_steps": study_warmup(steps, warmup)}


def study_converge(epochs: int, patience: int, holdout: float,
                   warmup: float = STUDY_WARMUP, anneal: int = 0) -> dict:
    """A study run's budget to convergence: at most ``epochs`` epochs (the cosine runs over
    them, the first ``warmup`` of them a linear warmup), evaluated every epoch on ``holdout``
    of the training split, stopped once the validation loss has not improved for
    ``patience`` epochs (0: never; the best epoch is still the one kept), then, with
    ``anneal``, that many epochs with the learning rate decayed to the floor."""
    return {"epochs": epochs, "steps": 0, "eval_every": 1, "holdout": holdout,
            "patience": patience, "warmup_epochs": warmup * epochs, "warmup_steps": 0,
            **({"anneal_epochs": anneal} if patience and anneal else {})}


def study_base(**options) -> dict:
    """The training options every study run shares (``vitkit study``, data and patch modes):
    ``options`` (data, model, img_size, batch_size, lr, out, ...), warmup in steps only (set by
    :func:`study_budget`) and one evaluation at the end."""
    return {**options, "warmup_epochs": 0.0, "eval_every": EVAL_AT_END}
