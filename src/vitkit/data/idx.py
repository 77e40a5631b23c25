"""IDX files, the format of MNIST and Fashion-MNIST, and where to find them.

An IDX file is a 4-byte big-endian magic number ``0x000008NN`` (``08``: unsigned bytes, ``NN``:
the number of dimensions), the dimensions as big-endian uint32, then the values. The image files
(``*-images-idx3-ubyte``) are 0x00000803: uint8 pixels (n, rows, cols); the label files
(``*-labels-idx1-ubyte``) are 0x00000801: uint8 labels (n,). Both are read gzip-compressed
(``.gz``, as distributed) or not.

torchvision has readers for the same format (``torchvision.datasets.mnist.read_image_file`` and
``read_label_file``), but they read uncompressed files only and torchvision is an optional
dependency (the ``train`` extra), so this small numpy parser reads them, and says which file is
wrong and how when one is.
"""

from __future__ import annotations

import functools
import gzip
import math
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from vitkit.errors import DataError

__all__ = ["DEBIAN_FASHION_MNIST", "FILES", "IDX_CLASSES", "find_idx_folder", "load_idx",
           "read_idx", "write_idx"]

# split -> (images, labels), without ".gz"; "val" is the standard test set (t10k)
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
IDX_CLASSES = {
    "fashion-mnist": ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                      "Sneaker", "Bag", "Ankle boot"],
    "mnist": [str(i) for i in range(10)],
}
# sub-folders of the data root looked in after the root itself (torchvision's layout last)
_SUBFOLDERS = {"fashion-mnist": ("fashion-mnist", "FashionMNIST/raw"),
               "mnist": ("mnist", "MNIST/raw")}
# Debian's and Ubuntu's package dataset-fashion-mnist: the four .gz files
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
_SOURCES = {
    "fashion-mnist": "https://github.com/zalandoresearch/fashion-mnist",
    "mnist": "https://ossci-datasets.s3.amazonaws.com/mnist/ (the mirror torchvision uses)",
}
_KIND = {3: "images (uint8, n x rows x cols)", 1: "labels (uint8, n)"}


def _decompressed(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path} does not exist") from None
    except IsADirectoryError:
        raise DataError(f"{path} is a folder, not an IDX file") from None
    if path.suffix != ".gz":
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as err:  # not gzip, cut short, corrupt
        raise DataError(f"{path} is not a readable .gz file ({err}): download it again") from err


@functools.lru_cache(maxsize=8)
def _read_cached(path: str, ndim: int, mtime_ns: int, size: int) -> np.ndarray:
    """The array of an IDX file, read once per (path, modification time, size) in a process:
    train and val, and the model and its teacher, load the same files."""
    p = Path(path)
    data = _decompressed(p)
    magic = 0x0800 | ndim
    header = 4 + 4 * ndim
    fix = "replace it with the original file (a partial download, or another file)"
    found = int.from_bytes(data[:4], "big") if len(data) >= 4 else None
    if found is not None and found != magic:
        raise DataError(f"{p} is not an IDX file of {_KIND[ndim]}: its magic number is "
                        f"0x{found:08x}, expected 0x{magic:08x}: {fix}")
    if len(data) < header:
        raise DataError(f"{p} holds {len(data)} bytes, fewer than the {header}-byte header of "
                        f"IDX {_KIND[ndim]}: {fix}")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    expected = header + math.prod(shape)
    if len(data) != expected:
        cut = "truncated" if len(data) < expected else "longer than its header says"
        raise DataError(f"{p} is {cut}: {len(data) - header:,} bytes of values, expected "
                        f"{expected - header:,} for shape {shape}: {fix}")
    return np.frombuffer(data, np.uint8, offset=header).reshape(shape)  # read-only


def read_idx(path: str | os.PathLike, ndim: int) -> np.ndarray:
    """The uint8 array of an IDX file (``.gz`` or not) with ``ndim`` dimensions: images
    (n, rows, cols) for ``ndim=3``, labels (n,) for ``ndim=1``.

    The array is read-only and cached per file in this process (a changed file is read again).
    Raises :class:`~vitkit.errors.DataError` naming the file when it is missing, not gzip, has
    another magic number (another type or number of dimensions) or another length than its
    header says.
    """
    if ndim not in _KIND:
        raise DataError(f"ndim must be 3 (images) or 1 (labels), got {ndim}")
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except FileNotFoundError:
        raise DataError(f"{p} does not exist") from None
    return _read_cached(str(p.resolve()), ndim, st.st_mtime_ns, st.st_size)


def write_idx(path: str | os.PathLike, array: np.ndarray) -> Path:
    """Write a uint8 array of 1 to 3 dimensions (images (n, rows, cols), labels (n,)) as an IDX
    file, gzip-compressed when ``path`` ends in ``.gz``. The inverse of :func:`read_idx`."""
    array = np.asarray(array)
    if array.dtype != np.uint8 or not 1 <= array.ndim <= 3:
        raise DataError(f"IDX files here hold uint8 arrays of 1 to 3 dimensions, got "
                         f"{array.dtype} {array.shape}")
    data = (struct.pack(f">I{array.ndim}I", 0x0800 | array.ndim, *array.shape)
            + np.ascontiguousarray(array).tobytes())
    path = Path(path)
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return path


def _file(folder: Path, name: str) -> Path | None:
    """``folder/name``, or ``folder/name.gz``; the uncompressed file first (faster to read)."""
    for p in (folder / name, folder / f"{name}.gz"):
        if p.is_file():
            return p
    return None


def find_idx_folder(name: str, root: str | os.PathLike) -> Path:
    """The folder holding the IDX files of ``name`` ("fashion-mnist" or "mnist").

    Looked in, in order: ``root`` itself, ``root/fashion-mnist`` and ``root/FashionMNIST/raw``
    (torchvision's layout; ``root/mnist`` and ``root/MNIST/raw`` for MNIST), then, for
    Fashion-MNIST only, :data:`DEBIAN_FASHION_MNIST` (Debian's ``dataset-fashion-mnist``
    package). The first folder that holds any of the four files is the one; a folder without
    any is a :class:`~vitkit.errors.DataError` that says how to get them.
    """
    if name not in IDX_CLASSES:
        raise DataError(f"unknown IDX dataset {name!r}; choose one of {', '.join(IDX_CLASSES)}")
    root = Path(root).expanduser()
    places = [root, *(root / sub for sub in _SUBFOLDERS[name])]
    if name == "fashion-mnist":
        places.append(DEBIAN_FASHION_MNIST)
    names = [f for pair in FILES.values() for f in pair]
    for folder in places:
        if folder.is_dir() and any(_file(folder, f) for f in names):
            return folder
    files = ", ".join(f"{f}.gz" for f in names)
    looked = ", ".join(str(p) for p in places)
    if name == "fashion-mnist":
        raise DataError(
            f"fashion-mnist is not in {looked}. Install it with 'apt-get install "
            f"dataset-fashion-mnist' (Debian/Ubuntu), or download the four IDX files ({files}) "
            f"from {_SOURCES[name]} into the data root (--data-root, now {root})")
    raise DataError(
        f"{name} is not in {looked}. Put its four IDX files ({files}, from {_SOURCES[name]}) "
        f"in the data root (--data-root, now {root}) or in {root / _SUBFOLDERS[name][0]}")


def load_idx(name: str, split: str, root: str | os.PathLike = "data"
             ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(images (n, rows, cols) uint8, labels (n,) int64, class names) of one split of
    Fashion-MNIST or MNIST, from :func:`find_idx_folder`.

    "train" is the 60,000 training images; "val" the 10,000 of the standard test set (t10k),
    used here as the validation split. Both must be in the same folder: a folder with only one
    split's files is an error, never filled in from another place.
    """
    if split not in FILES:
        raise DataError(f"split must be 'train' or 'val', got {split!r}")
    folder = find_idx_folder(name, root)
    images_name, labels_name = FILES[split]
    paths = []
    for f in (images_name, labels_name):
        p = _file(folder, f)
        if p is None:
            raise DataError(f"{folder} has IDX files of {name} but not {f}(.gz), which the "
                            f"{split} split needs: add it from {_SOURCES[name]}")
        paths.append(p)
    images, labels = read_idx(paths[0], 3), read_idx(paths[1], 1)
    if len(images) != len(labels):
        raise DataError(f"{paths[0]} holds {len(images):,} images but {paths[1]} "
                        f"{len(labels):,} labels: they must be the same split of one dataset")
    classes = IDX_CLASSES[name]
    if len(labels) and int(labels.max()) >= len(classes):
        raise DataError(f"{paths[1]} holds label {int(labels.max())}; {name} has labels 0-"
                        f"{len(classes) - 1}: replace it with the original file")
    return images, labels.astype(np.int64), list(classes)
