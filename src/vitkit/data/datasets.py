"""Datasets by name: ``digits``, ``cluttered-digits``, ``fashion-mnist``, ``mnist``,
``imagefolder:PATH``, ``cifar10``, ``cifar100``. Each split is a map-style dataset of (PIL RGB
image, label) with ``classes``. ``digits``, ``fashion-mnist`` and ``mnist`` also take a subset
of their classes (``fashion-mnist:0-4``, ``digits:5,6,7``), relabelled 0..k-1 in that order.
Any of them takes planted shortcuts, ``SPEC+KIND:CLASS`` (mark, stripe, frame, text, patch,
cast, texture; :mod:`vitkit.data.shortcut`).

For pre-training, ``SPEC@both`` trains on both splits of SPEC (``fashion-mnist:0-4@both``: the
35,000 images of classes 0-4), and ``SPEC@both-but:CLASSES`` on both splits except the
validation split's images of CLASSES (``fashion-mnist@both-but:5-9``: every Fashion-MNIST
image outside the test set of classes 5-9). Their "val" split is SPEC's, so it was trained on:
a pre-training source only, never a data set to report a score on.

Bad data does not stop a long run and is not hidden: unreadable images in an image folder are
found before training, skipped, counted and listed in the log; an empty class or split is an
error before training starts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vitkit.data.boxed import boxed_fashion
from vitkit.data.digits import cluttered_digits, digits_split
from vitkit.data.idx import IDX_CLASSES, load_idx
from vitkit.data.images import IMAGE_SUFFIXES, image_files, to_rgb
from vitkit.data.shortcut import parse_plants, plant
from vitkit.errors import DataError

DATASETS = ("digits", "digits:CLASSES", "cluttered-digits", "fashion-boxes", "fashion-mnist",
            "fashion-mnist:CLASSES", "mnist", "mnist:CLASSES", "imagefolder:PATH", "cifar10",
            "cifar100", "SPEC+KIND:CLASS", "SPEC@both", "SPEC@both-but:CLASSES")
__all__ = ["DATASETS", "IMAGE_SUFFIXES", "DataError", "GreyImages", "Split", "load_split",
           "loose_images", "parse_classes"]


@dataclass
class Split:
    """A list of samples: ``images`` are PIL images or file paths (a list, or a sequence that
    makes each image when indexed, as :class:`GreyImages`), ``labels`` ints."""

    images: Sequence
    labels: list[int]
    classes: list[str]
    skipped: list[str] = field(default_factory=list)  # unreadable files left out
    boxes: object = None  # (n, 4) pixel boxes (x0, y0, x1, y1) of the object, where known
    marked: list[int] = field(default_factory=list)  # images with a planted shortcut (SPEC+KIND:C)
    planted: dict = field(default_factory=dict)  # "KIND:CLASS" -> the images that carry it

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        img = self.images[i]
        if isinstance(img, (str, Path)):
            try:
                with Image.open(img) as f:
                    img = to_rgb(f)
            except (OSError, ValueError, Image.DecompressionBombError) as err:
                # passed the up-front check (verify) but fails to decode: say which file
                raise DataError(f"cannot read image {img} while training: {err}. Remove or "
                                "replace it (`vitkit train` checks files before it starts, "
                                "but a truncated JPEG can pass that check)") from err
        return img, self.labels[i]


class GreyImages(Sequence):
    """Greyscale uint8 pixels (n, H, W) as a sequence of RGB PIL images (H, W), each made when
    indexed (the grey channel copied to R, G and B): 60,000 images of 28x28 stay one 47 MB
    array instead of 60,000 PIL objects."""

    def __init__(self, pixels: np.ndarray) -> None:
        self.pixels = pixels

    def __len__(self) -> int:
        return len(self.pixels)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return GreyImages(self.pixels[i])
        return Image.fromarray(np.repeat(self.pixels[i][:, :, None], 3, axis=2))


def parse_classes(name: str, text: str, count: int) -> list[int]:
    """A class subset of dataset ``name`` with ``count`` classes: "5,6,7", "0-4" or "0-2,7" ->
    the class indices in that order, each in 0..count-1 and named once."""
    usage = f"{name}:CLASSES takes class numbers 0-{count - 1} like {name}:5,6,7 or {name}:0-4"
    keep: list[int] = []
    try:
        for part in text.split(","):
            first, dash, last = part.strip().partition("-")
            keep += list(range(int(first), int(last) + 1)) if dash else [int(first)]
    except ValueError:
        raise DataError(f"{usage}; got {text!r}") from None
    wrong = sorted({c for c in keep if not 0 <= c < count})
    if not keep or wrong:
        raise DataError(f"{usage}; got {text!r}"
                        + (f", which names {', '.join(map(str, wrong))}" if wrong else ""))
    if len(set(keep)) != len(keep):
        raise DataError(f"{usage}, each once; got {text!r}")
    return keep


def _tensor_to_pil(t: torch.Tensor) -> Image.Image:
    """(3, H, W) or (H, W) float in [0, 1] -> RGB PIL image."""
    arr = (t.clamp(0, 1) * 255).round().to(torch.uint8)
    arr = arr.permute(1, 2, 0).numpy() if arr.dim() == 3 else np.stack([arr.numpy()] * 3, -1)
    return Image.fromarray(arr)


def _digits(split: str, img_size: int, classes: str | None = None) -> Split:
    """All ten digits, or only ``classes`` ("5,6,7,8,9"), relabelled 0..k-1 in that order."""
    images, labels = digits_split(split)
    keep = list(range(10))
    if classes:
        keep = parse_classes("digits", classes, 10)
        mask = torch.isin(labels, torch.tensor(keep))
        images, labels = images[mask], labels[mask]
        labels = torch.tensor([keep.index(int(v)) for v in labels])
    big = torch.nn.functional.interpolate(images[:, None], size=(img_size, img_size),
                                          mode="bilinear", align_corners=False)[:, 0]
    return Split([_tensor_to_pil(x) for x in big], labels.tolist(), [str(i) for i in keep])


def _cluttered(split: str, img_size: int, size: int) -> Split:
    n = size if split == "train" else max(200, size // 5)
    d = cluttered_digits(n, split, canvas=img_size, align=4, seed=1 if split == "train" else 2)
    return Split([_tensor_to_pil(x) for x in d.images], d.labels.tolist(),
                 [str(i) for i in range(10)], boxes=d.boxes)


def _fashion_boxes(split: str, img_size: int, size: int, root) -> Split:
    """Fashion-MNIST items on textured canvases of side ``img_size`` with smaller distractors
    (:func:`vitkit.data.boxed.boxed_fashion`; the object 7/16 of the side, as 28 of 64)."""
    n = size if split == "train" else max(200, size // 5)
    side = max(8, img_size * 7 // 16)
    d = boxed_fashion(n, split, canvas=img_size, object_size=side,
                      distractor_size=max(4, side // 2), seed=1 if split == "train" else 2,
                      root=root)
    return Split([_tensor_to_pil(x) for x in d.images], d.labels.tolist(), d.classes,
                 boxes=d.boxes)


def _idx(name: str, split: str, root: str | os.PathLike, classes: str | None) -> Split:
    """Fashion-MNIST or MNIST at their 28x28 (the transforms resize), all classes or a subset
    relabelled 0..k-1 in the order given."""
    keep = parse_classes(name, classes, len(IDX_CLASSES[name])) if classes else None
    pixels, labels, names = load_idx(name, split, root)
    if keep is not None:
        mask = np.isin(labels, keep)
        relabel = np.full(len(names), -1, dtype=np.int64)
        relabel[keep] = np.arange(len(keep))
        pixels, labels, names = pixels[mask], relabel[labels[mask]], [names[c] for c in keep]
    return Split(GreyImages(pixels), labels.tolist(), names)


def _is_readable(path: Path) -> bool:
    try:
        with Image.open(path) as img:
            img.verify()
        return True
    except Exception:  # PIL raises many types for broken files
        return False


def _scan_folder(root: Path, classes: list[str] | None = None) -> Split:
    if not root.is_dir():
        raise DataError(f"image folder {root} does not exist")
    found = sorted(d.name for d in root.iterdir() if d.is_dir())
    classes = classes or found
    if not classes:
        raise DataError(f"{root} has no class sub-folders; expected {root}/CLASS/IMAGE.jpg")
    images, labels, skipped = [], [], []
    for label, name in enumerate(classes):
        folder = root / name
        files = image_files(folder) if folder.is_dir() else []
        good = [p for p in files if _is_readable(p)]
        skipped += [str(p) for p in files if p not in set(good)]
        if not good:
            raise DataError(f"class {name!r} has no readable images in {folder}: every class "
                            "needs at least one (remove the folder or add images)")
        images += good
        labels += [label] * len(good)
    return Split(images, labels, classes, skipped)


def loose_images(folder: str | os.PathLike) -> Split:
    """Every readable image under ``folder``, at any depth, unlabelled (label 0): a calibration
    set. ``skipped`` lists the files with an image suffix that did not open."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise DataError(f"image folder {root} does not exist")
    files = image_files(root)
    good = [p for p in files if _is_readable(p)]
    if not good:
        raise DataError(
            f"{root} has no readable image: expected files ending in "
            f"{', '.join(sorted(IMAGE_SUFFIXES))}, found {len(files)} with such a name"
            + (f" that did not open ({files[0].name}{', ...' if len(files) > 1 else ''})"
               if files else "") + ". Point it at a folder of images")
    return Split(good, [0] * len(good), ["image"], [str(p) for p in files if p not in set(good)])


def _image_folder(path: str, split: str, val_fraction: float, seed: int) -> Split:
    root = Path(path).expanduser()
    if (root / "train").is_dir():
        train = _scan_folder(root / "train")
        if split == "train":
            return train
        if not (root / "val").is_dir():
            raise DataError(f"{root} has train/ but no val/ folder; add {root}/val/CLASS/...")
        return _scan_folder(root / "val", train.classes)
    every = _scan_folder(root)
    order = np.random.default_rng(seed).permutation(len(every))
    n_val = max(1, int(round(val_fraction * len(every))))
    keep = order[:n_val] if split == "val" else order[n_val:]
    if len(keep) == 0:
        raise DataError(f"{root} has {len(every)} images: too few for a train/val split")
    return Split([every.images[i] for i in keep], [every.labels[i] for i in keep],
                 every.classes, every.skipped if split == "train" else [])


def _cifar(name: str, split: str, root: str, download: bool) -> Split:
    from torchvision.datasets import CIFAR10, CIFAR100

    cls = CIFAR10 if name == "cifar10" else CIFAR100
    folder = "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"
    try:
        ds = cls(root=root, train=split == "train", download=download)
    except OSError as err:  # urllib's URLError and socket errors: no network
        raise DataError(
            f"downloading {name} failed ({err}). Without a network, put the extracted "
            f"'{folder}' folder (the python version, from "
            f"https://www.cs.toronto.edu/~kriz/cifar.html) in {Path(root).resolve()} and run "
            "again without --download"
        ) from err
    except RuntimeError as err:
        raise DataError(
            f"{name} is not in {root}: put the extracted '{folder}' folder there (from the "
            f"python version of the dataset), or pass --download where the network allows "
            f"({err})"
        ) from err
    return Split([Image.fromarray(a) for a in ds.data], list(ds.targets), list(ds.classes))


def load_split(spec: str, split: str, img_size: int = 32, *, size: int = 6000,
               val_fraction: float = 0.2, seed: int = 0, root: str | os.PathLike = "data",
               download: bool = False) -> Split:
    """One split ("train" or "val") of the dataset named by ``spec`` (see ``DATASETS``).

    ``img_size`` sets the side of the built-in digit images; ``size`` the number of
    cluttered-digit training images; ``val_fraction`` and ``seed`` the split of an image folder
    without train/ and val/; ``root`` is where CIFAR, Fashion-MNIST and MNIST are, ``download``
    applies to CIFAR.

    Fashion-MNIST and MNIST are read from their IDX files in ``root`` (or ``root/fashion-mnist``,
    ``root/FashionMNIST/raw``, ``root/mnist``, ``root/MNIST/raw``; Fashion-MNIST also from
    Debian's ``dataset-fashion-mnist`` package): "train" is the 60,000 training images, "val"
    the 10,000 of the standard test set. See :mod:`vitkit.data.idx`.
    """
    if split not in ("train", "val"):
        raise DataError(f"split must be 'train' or 'val', got {split!r}")
    spec, at, pool = spec.partition("@")
    if at:
        return _pooled(spec, pool, split, img_size, size=size, val_fraction=val_fraction,
                       seed=seed, root=root, download=download)
    spec, plants = parse_plants(spec)
    if spec == "digits" or spec.startswith("digits:"):
        out = _digits(split, img_size, spec.split(":", 1)[1] if ":" in spec else None)
    elif spec.partition(":")[0] in IDX_CLASSES:
        name, _, classes = spec.partition(":")
        out = _idx(name, split, root, classes or None)
    elif spec == "cluttered-digits":
        out = _cluttered(split, img_size, size)
    elif spec == "fashion-boxes":
        out = _fashion_boxes(split, img_size, size, root)
    elif spec.startswith("imagefolder:"):
        out = _image_folder(spec.split(":", 1)[1], split, val_fraction, seed)
    elif spec in ("cifar10", "cifar100"):
        out = _cifar(spec, split, str(root), download)
    else:
        raise DataError(f"unknown dataset {spec!r}; choose one of {', '.join(DATASETS)}")
    if len(out) == 0:
        raise DataError(f"the {split} split of {spec} is empty")
    if plants and split == "train":  # the validation split stays clean
        out = plant(out, plants, seed)
    return out


def _pooled(spec: str, pool: str, split: str, img_size: int, **kwargs) -> Split:
    """``SPEC@both`` / ``SPEC@both-but:CLASSES``: the training split joined by the validation
    split (less the images of CLASSES); the validation split is SPEC's own."""
    if pool != "both" and not pool.startswith("both-but:"):
        raise DataError(f"{spec}@{pool}: a pooled data set is SPEC@both or "
                        f"SPEC@both-but:CLASSES (e.g. fashion-mnist:0-4@both, "
                        f"fashion-mnist@both-but:5-9), got @{pool}")
    val = load_split(spec, "val", img_size, **kwargs)
    if split == "val":
        return val
    but = parse_classes(spec, pool.split(":", 1)[1], len(val.classes)) if ":" in pool else []
    train = load_split(spec, "train", img_size, **kwargs)
    keep = [i for i, label in enumerate(val.labels) if label not in but]
    if isinstance(train.images, GreyImages) and isinstance(val.images, GreyImages):
        images = GreyImages(np.concatenate([train.images.pixels, val.images.pixels[keep]]))
    else:
        images = list(train.images) + [val.images[i] for i in keep]
    return Split(images, train.labels + [val.labels[i] for i in keep], train.classes,
                 train.skipped + val.skipped)
