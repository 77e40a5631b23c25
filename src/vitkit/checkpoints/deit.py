"""DeiT checkpoints (facebookresearch/deit): timm's layout inside ``{"model": ...}``, and for
the distilled models a distillation token ``dist_token`` and a second head ``head_dist``.
At inference a distilled model averages its two heads, as DeiT does."""

from __future__ import annotations

from vitkit.checkpoints import timm
from vitkit.checkpoints.common import Checkpoint, StateDict

NAME = "deit"
LABEL = "DeiT (timm keys with dist_token, inside {\"model\": ...})"
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def detect(ckpt: Checkpoint) -> bool:
    return "patch_embed.proj.weight" in ckpt.state and "dist_token" in ckpt.state


def to_vitkit(state: StateDict, config: dict | None, notes: list[str]):
    state, kwargs, extra = timm.to_vitkit(state, config, notes)
    extra.setdefault("mean", IMAGENET_MEAN)  # DeiT trains with ImageNet statistics
    extra.setdefault("std", IMAGENET_STD)
    return state, kwargs, extra
