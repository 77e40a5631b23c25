"""A compact, deterministic training loop on in-memory tensors.

AdamW with linear warmup then cosine decay, optional label smoothing and a per-batch
augmentation callable, a progress bar (epoch, loss, lr, images/s; quiet off a terminal).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm


def cosine_lr(step: int, total: int, warmup: int, base: float, floor: float = 0.0) -> float:
    """Linear warmup from ~0 to ``base`` over ``warmup`` steps, then cosine down to ``floor``."""
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return floor + (base - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def fit(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, epochs: int,
        batch_size: int = 128, lr: float = 1e-3, weight_decay: float = 0.05,
        warmup_epochs: float = 1.0, label_smoothing: float = 0.0,
        augment: Callable[[torch.Tensor], torch.Tensor] | None = None, seed: int = 0,
        desc: str = "train", progress: bool | None = None) -> list[dict]:
    """Train ``model`` on (N, C, H, W) images and (N,) labels; returns per-epoch history.

    Weight decay applies to matrices only (not biases, norms, tokens or position tables).
    """
    g = torch.Generator().manual_seed(seed)
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2
             and p.shape[:2] != (1, 1) and not _is_pos(model, p)]
    ids = {id(p) for p in decay}
    no_decay = [p for p in model.parameters() if p.requires_grad and id(p) not in ids]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr)
    steps_per_epoch = math.ceil(len(labels) / batch_size)
    total, warmup = epochs * steps_per_epoch, int(warmup_epochs * steps_per_epoch)
    show = sys.stderr.isatty() if progress is None else progress
    history, step = [], 0
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(labels), generator=g)
        bar = tqdm(range(steps_per_epoch), desc=f"{desc} {epoch + 1}/{epochs}", disable=not show,
                   leave=False)
        seen, loss_sum, start = 0, 0.0, time.perf_counter()
        for i in bar:
            idx = order[i * batch_size:(i + 1) * batch_size]
            x, y = images[idx], labels[idx]
            if augment is not None:
                x = augment(x)
            for group in opt.param_groups:
                group["lr"] = cosine_lr(step, total, warmup, lr)
            loss = F.cross_entropy(model(x), y, label_smoothing=label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            seen += len(idx)
            loss_sum += loss.item() * len(idx)
            rate = seen / (time.perf_counter() - start)
            bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{opt.param_groups[0]['lr']:.2e}",
                            img_s=f"{rate:.0f}")
        history.append({"epoch": epoch + 1, "loss": loss_sum / seen,
                        "seconds": time.perf_counter() - start})
    return history


def _is_pos(model: nn.Module, p: torch.Tensor) -> bool:
    return p is getattr(model, "pos_embed", None)


@torch.no_grad()
def evaluate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
             batch_size: int = 512) -> float:
    """Top-1 accuracy in [0, 1]."""
    model.eval()
    correct = 0
    for i in range(0, len(labels), batch_size):
        correct += (model(images[i:i + batch_size]).argmax(-1) == labels[i:i + batch_size]).sum()
    return float(correct) / len(labels)
