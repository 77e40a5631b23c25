"""Training: ``train`` (from scratch, fine-tuning, distillation, resumable, torchrun) and
``TrainConfig`` with its recipes. Needs the ``train`` extra."""

from vitkit.train.config import RECIPES, TrainConfig, resolve
from vitkit.train.trainer import NonFiniteLoss, RunResult, train

__all__ = ["RECIPES", "NonFiniteLoss", "RunResult", "TrainConfig", "resolve", "train"]
