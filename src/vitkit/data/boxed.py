"""Fashion-MNIST objects on larger, textured canvases with distractors: a harder dataset with a
known object box than the cluttered digits, for measuring where explanation maps point.

Each canvas (default 64 x 64) has a smooth random texture, one Fashion-MNIST item at full size
(the target: the label is its class, the box is where it is) and smaller items of other classes
as distractors, placed away from it. The train split draws its items from Fashion-MNIST's
60,000 training images, the validation split from the 10,000 test images: no item is shared.
Deterministic from a seed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from vitkit.data.idx import load_idx
from vitkit.errors import DataError


@dataclass
class Boxed:
    """Images (n, 3, S, S) in [0, 1], labels (n,), boxes (n, 4) as pixel (x0, y0, x1, y1) with
    x1/y1 exclusive, and the class names."""

    images: torch.Tensor
    labels: torch.Tensor
    boxes: torch.Tensor
    classes: list[str]

    def __len__(self) -> int:
        return len(self.labels)


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _texture(rng: np.random.Generator, canvas: int) -> torch.Tensor:
    """(S, S) in [0, 0.35]: low-frequency noise (an 8x8 grid upsampled) plus fine grain."""
    coarse = torch.from_numpy(rng.random((1, 1, 8, 8), dtype=np.float32))
    smooth = F.interpolate(coarse, size=(canvas, canvas), mode="bicubic",
                           align_corners=False)[0, 0].clamp(0, 1)
    grain = torch.from_numpy(rng.random((canvas, canvas), dtype=np.float32))
    return 0.3 * smooth + 0.05 * grain


def boxed_fashion(n: int, split: str = "train", canvas: int = 64, object_size: int = 28,
                  distractors: int = 2, distractor_size: int = 14, align: int = 4,
                  seed: int = 0, root: str | os.PathLike = "data") -> Boxed:
    """``n`` canvases of side ``canvas``: a texture, ``distractors`` items of other classes at
    ``distractor_size``, and the target item at ``object_size`` with its corner on multiples of
    ``align`` pixels (patch-aligned objects are learned faster by a small ViT from scratch)."""
    if not distractor_size <= object_size <= canvas:
        raise DataError(f"need distractor_size ({distractor_size}) <= object_size "
                         f"({object_size}) <= canvas ({canvas})")
    pixels, labels, names = load_idx("fashion-mnist", split, root)
    rng = np.random.default_rng(seed)

    def item(k: int, side: int) -> torch.Tensor:
        x = torch.from_numpy(pixels[k].astype(np.float32) / 255.0)[None, None]
        if side != x.shape[-1]:
            x = F.interpolate(x, size=(side, side), mode="bilinear", align_corners=False)
        return x[0, 0].clamp(0, 1)

    images = torch.empty(n, canvas, canvas)
    out_labels = torch.empty(n, dtype=torch.int64)
    boxes = torch.empty(n, 4, dtype=torch.int64)
    span = (canvas - object_size) // align + 1
    for i in range(n):
        img = _texture(rng, canvas)
        k = int(rng.integers(len(labels)))
        x0, y0 = align * int(rng.integers(span)), align * int(rng.integers(span))
        box = (x0, y0, x0 + object_size, y0 + object_size)
        placed = 0
        for _ in range(50 * max(distractors, 1)):  # rejection sampling; bounded
            if placed == distractors:
                break
            j = int(rng.integers(len(labels)))
            if labels[j] == labels[k]:
                continue
            px, py = (int(v) for v in rng.integers(canvas - distractor_size + 1, size=2))
            spot = (px, py, px + distractor_size, py + distractor_size)
            if _overlap(spot, box):
                continue
            region = img[py:py + distractor_size, px:px + distractor_size]
            torch.maximum(region, 0.8 * item(j, distractor_size), out=region)
            placed += 1
        region = img[y0:y0 + object_size, x0:x0 + object_size]
        torch.maximum(region, item(k, object_size), out=region)
        images[i], out_labels[i], boxes[i] = img, int(labels[k]), torch.tensor(box)
    return Boxed(images[:, None].expand(-1, 3, -1, -1).contiguous(), out_labels, boxes,
                 list(names))
