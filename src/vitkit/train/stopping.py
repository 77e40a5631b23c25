"""Training to convergence: early stopping on the validation loss and a held-out selection set.

``--patience P`` stops a run once its validation loss has not improved for ``P`` evaluations
in a row; ``--epochs`` (or ``--steps``) is then the maximum, and ``best.safetensors`` the
checkpoint of the lowest validation loss. ``--holdout S`` takes a share ``S`` of the training
split out of training (the same images for every seed and ``--data-fraction``, so nested
subsets stay nested and never hold a selection image): the epochs are judged on it, and the
validation split is evaluated once, on the best checkpoint, so no choice is made on the numbers
that are reported. The outcome is ``result.json`` in the run folder.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

HOLDOUT_SEED = 20_211_022  # fixed: every run of a data set holds out the same images


@dataclass
class EarlyStop:
    """The patience counter. ``patience`` 0: never stops (and ``best_epoch`` still follows
    the validation loss)."""

    patience: int = 0
    best_loss: float = math.inf
    best_epoch: int = 0  # 1-based; 0 before the first evaluation
    waited: int = 0  # evaluations since the best
    stopped: bool = False

    def update(self, val_loss: float, epoch: int) -> bool:
        """Record one evaluation after ``epoch`` (1-based); True when it is the new best. A
        NaN loss is never an improvement."""
        if val_loss < self.best_loss:  # NaN compares False
            self.best_loss, self.best_epoch, self.waited = val_loss, epoch, 0
            return True
        self.waited += 1
        self.stopped = self.patience > 0 and self.waited >= self.patience
        return False

    def state(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict | None, patience: int) -> EarlyStop:
        """The counter a resumed run continues with (a state.pt without one: a fresh one)."""
        if not state:
            return cls(patience)
        return cls(**{**state, "patience": patience})


def holdout_split(split, share: float):
    """(training part, held-out part) of ``split``: ``share`` of its images held out, chosen by
    a fixed permutation (:data:`HOLDOUT_SEED`), so every run on this data holds out the same
    images. Both parts keep the split's classes."""
    n = len(split)
    held = max(1, round(share * n))
    if held >= n:
        raise ValueError(f"--holdout {share} of {n} training images leaves none to train on")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(HOLDOUT_SEED)).tolist()
    out, keep = sorted(order[:held]), sorted(order[held:])

    def part(idx):
        return type(split)([split.images[i] for i in idx], [split.labels[i] for i in idx],
                           split.classes, split.skipped)

    return part(keep), part(out)


def stop_reason(stop: EarlyStop, epochs_run: int, max_epochs: int) -> str:
    """'patience' when early stopping ended the run, 'maximum' when it ran every epoch."""
    return "patience" if stop.stopped and epochs_run < max_epochs else "maximum"
