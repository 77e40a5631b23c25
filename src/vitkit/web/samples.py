"""The sample images the explorer offers, as one fixed table built at start: the photographs
scikit-learn ships, validation images of the built-in cluttered digits (with the digit's box),
and the images of ``--images DIR``. The page asks for a sample by its index in the table; no
name or path from a request ever reaches the file system."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from vitkit.data.digits import cluttered_digits
from vitkit.data.images import IMAGE_SUFFIXES

log = logging.getLogger("vitkit")
MAX_FOLDER_IMAGES = 500


@dataclass(frozen=True)
class Sample:
    """One entry of the table: ``load()`` gives (image bytes or an RGB PIL image, the object's
    box (x0, y0, x1, y1) in its pixels or None)."""

    group: str
    label: str
    load: Callable[[], tuple[bytes | Image.Image, tuple[int, int, int, int] | None]]


def _photos() -> list[Sample]:
    try:
        from sklearn.datasets import load_sample_images
    except ImportError:
        log.info("scikit-learn is not installed: no sample photographs")
        return []
    bunch = load_sample_images()
    out = []
    for name, array in zip(bunch.filenames, bunch.images, strict=True):
        out.append(Sample("photographs (scikit-learn)", Path(name).name,
                          lambda a=array: (Image.fromarray(a), None)))
    return out


def _digits(n: int = 6) -> list[Sample]:
    def load(i: int):
        d = cluttered_digits(n, "val", canvas=32, align=4, seed=99)
        picture = (d.images[i].permute(1, 2, 0).numpy() * 255).round().astype("uint8")
        return Image.fromarray(picture), tuple(int(v) for v in d.boxes[i])

    labels = cluttered_digits(n, "val", canvas=32, align=4, seed=99).labels.tolist()
    return [Sample("cluttered digits (validation)", f"digit {label} #{i}",
                   lambda i=i: load(i)) for i, label in enumerate(labels)]


def _folder(folder: str | os.PathLike) -> list[Sample]:
    root = Path(folder)
    files = sorted(f for f in root.rglob("*") if f.is_file() and f.suffix.lower()
                   in IMAGE_SUFFIXES)
    if len(files) > MAX_FOLDER_IMAGES:
        log.info("--images %s holds %d images: the first %d are offered", root, len(files),
                 MAX_FOLDER_IMAGES)
    return [Sample(f"--images {root}", str(f.relative_to(root)),
                   lambda f=f: (f.read_bytes(), None)) for f in files[:MAX_FOLDER_IMAGES]]


def sample_table(images: str | os.PathLike | None = None) -> list[Sample]:
    """Every sample the page offers, in a fixed order."""
    return _photos() + _digits() + (_folder(images) if images else [])
