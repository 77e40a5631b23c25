"""Offline datasets built from scikit-learn's 1,797 real 8x8 handwritten digits.

``cluttered_digits`` pastes one real digit at a random position on a larger canvas, with
fragments of other digits as clutter away from it, and records the digit's box: a dataset with
known object positions, for measuring whether an attention map points at the object.
Everything is deterministic from a seed, and train/val use disjoint source digits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from vitkit.errors import DataError


def digits_split(split: str = "train", val_fraction: float = 0.2, seed: int = 0):
    """Source digits of one split: (images (n, 8, 8) float in [0, 1], labels (n,) int64).

    The 1,797 digits are permuted once with ``seed``; the last ``val_fraction`` are "val".
    ``split="all"`` returns all of them in the original order.
    """
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32) / 16.0  # (1797, 8, 8)
    labels = torch.tensor(data.target, dtype=torch.int64)
    if split == "all":
        return images, labels
    if split not in ("train", "val"):
        raise DataError(f"split must be 'train', 'val' or 'all', got {split!r}")
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    n_val = int(round(val_fraction * len(labels)))
    idx = order[len(labels) - n_val:] if split == "val" else order[: len(labels) - n_val]
    return images[idx], labels[idx]


@dataclass
class ClutteredDigits:
    """Images (n, 3, S, S) in [0, 1] (grey, repeated on 3 channels), labels (n,), boxes (n, 4)
    as pixel (x0, y0, x1, y1) with x1/y1 exclusive."""

    images: torch.Tensor
    labels: torch.Tensor
    boxes: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)


def _boxes_overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def cluttered_digits(
    n: int,
    split: str = "train",
    canvas: int = 32,
    digit_size: int = 8,
    clutter: int = 4,
    fragment: int = 4,
    align: int = 1,
    seed: int = 0,
) -> ClutteredDigits:
    """``n`` canvases, each with one digit of side ``digit_size`` (8 = the real pixels; larger
    is bilinear upsampling) and ``clutter`` fragments (``fragment`` x ``fragment`` crops of
    other digits of the same split) placed so they never overlap the digit's box. ``align``
    puts the digit's corner on multiples of that many pixels (``align`` = the patch size puts
    each digit on whole patches, which a ViT trained from scratch on little data learns far
    faster than arbitrary offsets; fragments stay anywhere)."""
    if digit_size > canvas or fragment > digit_size:
        raise DataError(f"need fragment ({fragment}) <= digit_size ({digit_size}) <= canvas "
                         f"({canvas})")
    src, src_labels = digits_split(split, seed=0)
    if digit_size != 8:
        src = F.interpolate(src[:, None], size=(digit_size, digit_size), mode="bilinear",
                            align_corners=False)[:, 0].clamp(0, 1)
    rng = np.random.default_rng(seed)
    images = torch.zeros(n, canvas, canvas)
    labels = torch.empty(n, dtype=torch.int64)
    boxes = torch.empty(n, 4, dtype=torch.int64)
    span = (canvas - digit_size) // align + 1
    for i in range(n):
        k = int(rng.integers(len(src)))
        x0, y0 = align * int(rng.integers(span)), align * int(rng.integers(span))
        box = (x0, y0, x0 + digit_size, y0 + digit_size)
        placed = 0
        for _ in range(50 * clutter):  # rejection sampling; bounded
            if placed == clutter:
                break
            other = src[int(rng.integers(len(src)))]
            cy, cx = rng.integers(digit_size - fragment + 1, size=2)
            px, py = rng.integers(canvas - fragment + 1, size=2)
            frag_box = (int(px), int(py), int(px) + fragment, int(py) + fragment)
            if _boxes_overlap(frag_box, box):
                continue
            piece = other[cy:cy + fragment, cx:cx + fragment]
            region = images[i, py:py + fragment, px:px + fragment]
            torch.maximum(region, piece, out=region)
            placed += 1
        images[i, y0:y0 + digit_size, x0:x0 + digit_size] = src[k]
        labels[i] = src_labels[k]
        boxes[i] = torch.tensor(box)
    return ClutteredDigits(images[:, None].expand(-1, 3, -1, -1).contiguous(), labels, boxes)
