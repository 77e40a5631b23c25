"""DeiT checkpoints (facebookresearch/deit): timm's layout inside ``{"model": ...}``, and for
the distilled models a distillation token ``dist_token`` and a second head ``head_dist``.
At inference a distilled model averages its two heads, as DeiT does."""

from __future__ import annotations

from vitkit.checkpoints import timm
from vitkit.checkpoints.common import Checkpoint, StateDict
from vitkit.data.images import IMAGENET_MEAN, IMAGENET_STD

NAME = "deit"
LABEL = "DeiT (timm keys with dist_token, inside {\"model\": ...})"
DEPTH_FROM_WEIGHTS = True  # a bare file does not state its depth: blocks may be lost unseen


def detect(ckpt: Checkpoint) -> bool:
    return "patch_embed.proj.weight" in ckpt.state and "dist_token" in ckpt.state


def to_vitkit(state: StateDict, config: dict | None, notes: list[str],
              named: dict | None = None):
    state, kwargs, extra = timm.to_vitkit(state, config, notes, named)
    extra.setdefault("mean", list(IMAGENET_MEAN))  # DeiT trains with ImageNet statistics
    extra.setdefault("std", list(IMAGENET_STD))
    return state, kwargs, extra
