"""Training to convergence: early stopping on the validation loss and a held-out selection set.

``--patience P`` stops a run once its validation loss has not improved for ``P`` evaluations
in a row; ``--epochs`` (or ``--steps``) is then the maximum, and ``best.safetensors`` the
checkpoint of the lowest validation loss. ``--holdout S`` takes a share ``S`` of the training
split out of training (the same images for every seed and ``--data-fraction``, so nested
subsets stay nested and never hold a selection image): the epochs are judged on it, and the
validation split is evaluated once, on the best checkpoint, so no choice is made on the numbers
that are reported. The outcome is ``result.json`` in the run folder.

``--anneal-epochs N``: early stopping halts a cosine schedule mid-way, at a learning rate far
above its floor, so a stopped run is under-trained. With N > 0, when patience runs out the run
goes on for N epochs with the learning rate decayed from its value at the stop to the floor
(a cosine over those epochs' steps), then ends; the best checkpoint is still the lowest
validation loss of the whole run, anneal included.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from vitkit.errors import ConfigError

HOLDOUT_SEED = 20_211_022  # fixed: every run of a data set holds out the same images


@dataclass
class EarlyStop:
    """The patience counter. ``patience`` 0: never stops (and ``best_epoch`` still follows
    the validation loss)."""

    patience: int = 0
    best_loss: float = math.inf
    best_epoch: int = 0  # 1-based; 0 before the first evaluation
    waited: int = 0  # evaluations since the best
    stopped: bool = False  # patience ran out
    anneal_epochs: int = 0  # epochs of annealing after the stop (--anneal-epochs)
    anneal_from: int = 0  # the epoch (1-based) after which annealing began; 0: it has not
    anneal_step: int = 0  # the optimizer step annealing began at
    anneal_lr: float = 0.0  # the learning rate it decays from
    best_before_anneal: float = math.inf  # the best validation loss when annealing began

    def update(self, val_loss: float, epoch: int) -> bool:
        """Record one evaluation after ``epoch`` (1-based); True when it is the new best. A
        NaN loss is never an improvement."""
        if val_loss < self.best_loss:  # NaN compares False
            self.best_loss, self.best_epoch, self.waited = val_loss, epoch, 0
            return True
        self.waited += 1
        self.stopped = self.stopped or (self.patience > 0 and self.waited >= self.patience)
        return False

    @property
    def annealing(self) -> bool:
        return self.anneal_from > 0

    def begin_anneal(self, epoch: int, step: int, lr: float) -> None:
        """Patience ran out after ``epoch`` (1-based) at ``step``, the learning rate at
        ``lr``: the next ``anneal_epochs`` epochs decay it to the floor."""
        self.anneal_from, self.anneal_step, self.anneal_lr = epoch, step, lr
        self.best_before_anneal = self.best_loss

    def finished(self, epochs_done: int) -> bool:
        """Whether the run ends after ``epochs_done`` epochs: patience ran out and there is no
        annealing, or its epochs are done."""
        if not self.stopped:
            return False
        if not self.annealing:
            return self.anneal_epochs == 0
        return epochs_done >= self.anneal_from + self.anneal_epochs

    def lr(self, step: int, steps_per_epoch: int, floor: float) -> float:
        """The annealing learning rate of ``step``: a cosine from ``anneal_lr`` (the rate at
        the stop) down to ``floor``, which the last annealing step takes."""
        total = max(1, self.anneal_epochs * steps_per_epoch)
        done = min(max(step - self.anneal_step + 1, 0), total)
        return floor + (self.anneal_lr - floor) * 0.5 * (1 + math.cos(math.pi * done / total))

    def state(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict | None, patience: int, anneal_epochs: int = 0) -> EarlyStop:
        """The counter a resumed run continues with (a state.pt without one: a fresh one)."""
        if not state:
            return cls(patience, anneal_epochs=anneal_epochs)
        return cls(**{**state, "patience": patience, "anneal_epochs": anneal_epochs})


def holdout_split(split, share: float):
    """(training part, held-out part) of ``split``: ``share`` of its images held out, chosen by
    a fixed permutation (:data:`HOLDOUT_SEED`), so every run on this data holds out the same
    images. Both parts keep the split's classes."""
    n = len(split)
    held = max(1, round(share * n))
    if held >= n:
        raise ConfigError(f"--holdout {share} of {n} training images leaves none to train on")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(HOLDOUT_SEED)).tolist()
    out, keep = sorted(order[:held]), sorted(order[held:])

    def part(idx):
        return type(split)([split.images[i] for i in idx], [split.labels[i] for i in idx],
                           split.classes, split.skipped)

    return part(keep), part(out)


def stop_reason(stop: EarlyStop, epochs_run: int, max_epochs: int) -> str:
    """'patience' when early stopping ended the run, 'maximum' when it ran every epoch."""
    return "patience" if stop.stopped and epochs_run < max_epochs else "maximum"
