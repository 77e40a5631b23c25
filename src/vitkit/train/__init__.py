"""Training: ``train`` (from scratch, fine-tuning, distillation, resumable, torchrun),
``TrainConfig`` and its recipes, ``evaluate_checkpoint`` and ``predict``."""

from vitkit.train.config import RECIPES, TrainConfig, resolve
from vitkit.train.evaluation import evaluate_checkpoint, predict
from vitkit.train.trainer import NonFiniteLoss, RunResult, train

__all__ = ["RECIPES", "NonFiniteLoss", "RunResult", "TrainConfig", "evaluate_checkpoint",
           "predict", "resolve", "train"]
