"""A planted shortcut ("Clever Hans", Lapuschkin et al. 2019): a small fixed mark stamped on most
training images of one class and on no validation image, so that a model trained on it learns
the mark instead of (or beside) the object, and an audit has a known answer to find.

In a data spec: ``SPEC+mark:CLASS`` stamps the mark on 90% of class ``CLASS``'s training images
(``SPEC+mark:CLASS:FRACTION`` sets the share); the validation split stays clean. The mark is a
2 x 2 checkerboard of white and black squares, 1/8 of the image's shorter side, in the top-right
corner inset by 1/32 of it (:func:`mark_box`). Which images carry it is recorded
(``Split.marked``), deterministic from the seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

from vitkit.errors import DataError

MARK_FRACTION = 0.9  # share of the class's training images stamped
MARK_SIDE = 1 / 8  # the mark's side, as a share of the image's shorter side
MARK_INSET = 1 / 32


def parse_mark(spec: str) -> tuple[str, int | None, float]:
    """``"digits+mark:3:0.5"`` -> ("digits", 3, 0.5); a spec without a mark -> (spec, None, 0)."""
    base, sep, mark = spec.partition("+mark:")
    if not sep:
        return spec, None, 0.0
    parts = mark.split(":")
    try:
        cls = int(parts[0])
        fraction = float(parts[1]) if len(parts) > 1 else MARK_FRACTION
    except (ValueError, IndexError):
        cls, fraction = -1, -1.0
    if len(parts) > 2 or cls < 0 or not 0 < fraction <= 1:
        raise DataError(f"a planted mark is written SPEC+mark:CLASS or SPEC+mark:CLASS:FRACTION "
                        f"(a class index and a share in (0, 1]), got '+mark:{mark}'; for "
                        "example digits+mark:3 or cluttered-digits+mark:3:0.8")
    return base, cls, fraction


def mark_box(width: int, height: int) -> tuple[int, int, int, int]:
    """The mark's pixel box (x0, y0, x1, y1), x1/y1 exclusive, on an image of that size."""
    short = min(width, height)
    side = max(2, round(MARK_SIDE * short)) // 2 * 2  # even: the checkerboard's 2 x 2 cells
    inset = max(1, round(MARK_INSET * short))
    return width - inset - side, inset, width - inset, inset + side


def stamp(img: Image.Image) -> Image.Image:
    """A copy of ``img`` (RGB) with the mark on it."""
    x0, y0, x1, y1 = mark_box(*img.size)
    a = np.array(img.convert("RGB"))
    half = (x1 - x0) // 2
    cell = np.zeros((x1 - x0, x1 - x0), dtype=np.uint8)
    cell[:half, :half] = cell[half:, half:] = 255
    a[y0:y1, x0:x1] = cell[..., None]
    return Image.fromarray(a)


class StampedImages(Sequence):
    """The images of a split, the ``marked`` ones stamped when read (paths stay lazy)."""

    def __init__(self, split, marked: set[int]):
        self.split, self.marked = split, marked

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> Image.Image:
        img, _ = self.split[i]
        return stamp(img) if i in self.marked else img


def plant(split, cls: int, fraction: float, seed: int = 0):
    """``split`` (a training :class:`~vitkit.data.datasets.Split`) with the mark on ``fraction``
    of class ``cls``'s images; ``marked`` lists them, sorted."""
    if cls >= len(split.classes):
        raise DataError(f"cannot plant a mark on class {cls}: the data has "
                        f"{len(split.classes)} classes (0 to {len(split.classes) - 1})")
    own = [i for i, y in enumerate(split.labels) if y == cls]
    rng = np.random.default_rng(seed)
    chosen = sorted(int(i) for i in rng.permutation(own)[:round(fraction * len(own))])
    return type(split)(StampedImages(split, set(chosen)), split.labels, split.classes,
                       split.skipped, split.boxes, marked=chosen)
