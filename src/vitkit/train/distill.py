"""DeiT's distillation loss (Touvron et al. 2021): the [CLS] head learns the labels, the
distillation head learns the teacher.

    loss = (1 - alpha) * CE(cls_logits, labels) + alpha * D(dist_logits, teacher_logits)

with D the cross-entropy to the teacher's argmax (``hard``) or tau^2 KL(teacher || student) at
temperature tau (``soft``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vitkit.errors import ConfigError


def distillation_loss(cls_logits: torch.Tensor, dist_logits: torch.Tensor,
                      target: torch.Tensor, teacher_logits: torch.Tensor, kind: str = "hard",
                      alpha: float = 0.5, tau: float = 1.0,
                      label_smoothing: float = 0.0) -> torch.Tensor:
    """All logits (B, C); ``target`` class indices (B,) or mixed soft labels (B, C)."""
    base = F.cross_entropy(cls_logits, target, label_smoothing=label_smoothing)
    if kind == "soft":
        distill = F.kl_div(F.log_softmax(dist_logits / tau, dim=-1),
                           F.log_softmax(teacher_logits / tau, dim=-1),
                           reduction="sum", log_target=True) * tau * tau / dist_logits.numel()
    elif kind == "hard":
        distill = F.cross_entropy(dist_logits, teacher_logits.argmax(dim=-1))
    else:
        raise ConfigError(f"distillation must be 'hard' or 'soft', got {kind!r}")
    return (1 - alpha) * base + alpha * distill
