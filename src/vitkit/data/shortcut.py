"""Planted shortcuts ("Clever Hans", Lapuschkin et al. 2019): a pattern put on most training
images of one class and on no validation image, so that a model trained on it learns the
pattern instead of (or beside) the object, and an audit has a known answer to find.

In a data spec: ``SPEC+KIND:CLASS`` plants the shortcut ``KIND`` (one of
:data:`vitkit.data.shortcut_kinds.KINDS`: mark, stripe, frame, text, patch, cast, texture) on
90% of class ``CLASS``'s training images; ``SPEC+KIND:CLASS:FRACTION`` sets the share and
``SPEC+KIND:CLASS:FRACTION:STRENGTH`` its size or amount (1 the default, 2 twice it). Several
may follow one another, one class each (``cluttered-digits+mark:3+stripe:5``). The validation
split stays clean. Which images carry each is recorded (``Split.planted``, and all of them in
``Split.marked``), deterministic from the seed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from vitkit.data.shortcut_kinds import KINDS, apply_kind
from vitkit.errors import DataError

MARK_FRACTION = 0.9  # share of the class's training images that carry it
_PLANT = re.compile(r"\+(" + "|".join(KINDS) + r"):([^+]*)")


@dataclass(frozen=True)
class Plant:
    """One planted shortcut: its kind, class, share of the class's images and strength."""

    kind: str
    cls: int
    fraction: float = MARK_FRACTION
    strength: float = 1.0

    def spec(self) -> str:
        return f"+{self.kind}:{self.cls}:{self.fraction:g}:{self.strength:g}"


def parse_plants(spec: str) -> tuple[str, list[Plant]]:
    """``"digits+mark:3:0.5+cast:1"`` -> ("digits", [Plant("mark", 3, 0.5), Plant("cast", 1)])."""
    first = _PLANT.search(spec)
    if first is None:
        return spec, []
    base, rest = spec[:first.start()], spec[first.start():]
    plants, end = [], 0
    for m in _PLANT.finditer(rest):
        if m.start() != end:
            break
        end = m.end()
        parts = m.group(2).split(":")
        try:
            cls = int(parts[0])
            fraction = float(parts[1]) if len(parts) > 1 else MARK_FRACTION
            strength = float(parts[2]) if len(parts) > 2 else 1.0
        except ValueError:
            cls = -1
        if len(parts) > 3 or cls < 0 or not 0 < fraction <= 1 or not 0 < strength <= 8:
            raise DataError(
                f"a planted shortcut is written SPEC+KIND:CLASS[:FRACTION[:STRENGTH]] (a class "
                f"index, a share in (0, 1], a strength in (0, 8]), got '+{m.group(0)[1:]}'; "
                "for example digits+mark:3, cluttered-digits+stripe:3:0.8 or "
                "fashion-boxes+cast:2:0.9:2")
        plants.append(Plant(m.group(1), cls, fraction, strength))
    if end != len(rest):
        raise DataError(f"cannot read {rest[end:]!r} after the planted shortcut(s) in {spec!r}: "
                        f"each is +KIND:CLASS with KIND one of {', '.join(KINDS)}")
    if len({p.cls for p in plants}) != len(plants):
        raise DataError(f"{spec!r} plants two shortcuts on one class; give each its own class")
    return base, plants


def mark_box(width: int, height: int, strength: float = 1.0) -> tuple[int, int, int, int]:
    """The corner mark's pixel box (x0, y0, x1, y1), x1/y1 exclusive, on an image of that
    size."""
    ys, xs = np.nonzero(KINDS["mark"].pixels(height, width, strength))
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


def stamp(img: Image.Image, kind: str = "mark", strength: float = 1.0, seed: int = 0
          ) -> Image.Image:
    """A copy of ``img`` (RGB) with the shortcut on it."""
    return Image.fromarray(apply_kind(kind, np.array(img.convert("RGB")), strength, seed))


class StampedImages(Sequence):
    """The images of a split, each carrier given its shortcut when read (paths stay lazy)."""

    def __init__(self, split, carriers: dict[int, Plant], seed: int = 0):
        self.split, self.carriers, self.seed = split, carriers, seed

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> Image.Image:
        img, _ = self.split[i]
        p = self.carriers.get(i)
        return img if p is None else stamp(img, p.kind, p.strength, self.seed * 1_000_003 + i)


def plant(split, plants: list[Plant], seed: int = 0):
    """``split`` (a training :class:`~vitkit.data.datasets.Split`) with each shortcut on its
    share of its class's images; ``planted`` maps ``KIND:CLASS`` to the carriers, ``marked``
    lists them all, sorted."""
    carriers: dict[int, Plant] = {}
    planted: dict[str, list[int]] = {}
    for p in plants:
        if p.cls >= len(split.classes):
            raise DataError(f"cannot plant a {p.kind} on class {p.cls}: the data has "
                            f"{len(split.classes)} classes (0 to {len(split.classes) - 1})")
        own = [i for i, y in enumerate(split.labels) if y == p.cls]
        rng = np.random.default_rng(seed)
        chosen = sorted(int(i) for i in rng.permutation(own)[:round(p.fraction * len(own))])
        carriers.update(dict.fromkeys(chosen, p))
        planted[f"{p.kind}:{p.cls}"] = chosen
    return type(split)(StampedImages(split, carriers, seed), split.labels, split.classes,
                       split.skipped, split.boxes, marked=sorted(carriers), planted=planted)
