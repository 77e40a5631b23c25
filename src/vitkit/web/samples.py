"""The sample images the explorer offers, as one fixed table built at start: the photographs
scikit-learn ships, validation images of the built-in cluttered digits (with the digit's box),
the images of ``--images DIR``, and the images an audit saved (``--audit DIR``), grouped by
its flags, ranking and clusters. The page asks for a sample by its index in the table; no
name or path from a request ever reaches the file system."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from vitkit.data.digits import cluttered_digits
from vitkit.data.images import image_files
from vitkit.errors import DataError

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
    files = image_files(root)
    if len(files) > MAX_FOLDER_IMAGES:
        log.info("--images %s holds %d images: the first %d are offered", root, len(files),
                 MAX_FOLDER_IMAGES)
    return [Sample(f"--images {root}", str(f.relative_to(root)),
                   lambda f=f: (f.read_bytes(), None)) for f in files[:MAX_FOLDER_IMAGES]]


def read_audit(folder: str | os.PathLike) -> dict:
    """``audit.json`` of an audit folder (``vitkit audit``), or a clear error."""
    path = Path(folder) / "audit.json"
    try:
        record = json.loads(path.read_text())
        record["images"], record["clusters"], record["options"]["checkpoint"]
        record["findings"] + record["hypotheses"]  # lists, as audit_samples reads them
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(f"--audit {folder} is not a finished audit folder ({err}); give the "
                        "--out folder of a `vitkit audit` run that ended") from None
    return record


def audit_samples(folder: str | os.PathLike) -> list[Sample]:
    """The images an audit saved, grouped as its report shows them: each flag (findings
    first), the most suspicious images, then every cluster's typical images."""
    root = Path(folder)
    record = read_audit(root)
    saved = {int(d["index"]): d for d in record["images"]}

    def sample(group: str, i: int) -> Sample | None:
        d = saved.get(i)
        if d is None:
            return None
        label = (f"#{i} predicted {d['prediction']}"
                 + (f" (label {d['label']})" if d.get("label", -1) >= 0 else "")
                 + f", suspicion {d['suspicion']:.2f}")
        box = tuple(d["box"]) if d.get("box") else None
        file = root / "images" / f"{i:06d}.png"  # from the index, never a path from a file
        return Sample(group, label, lambda f=file, b=box: (f.read_bytes(), b))

    groups = [(f"audit: {f['title']}", f["images"])  # the title says finding or hypothesis
              for f in record["findings"] + record["hypotheses"]]
    groups.append(("audit: most suspicious images", record.get("ranked", [])))
    groups += [(f"audit: class {c['class']}, cluster {c['cluster']} ({c['size']} images)",
                c["typical"]) for c in record["clusters"]]
    out = [sample(group, int(i)) for group, members in groups for i in members]
    return [s for s in out if s is not None]


def sample_table(images: str | os.PathLike | None = None,
                 audit: str | os.PathLike | None = None) -> list[Sample]:
    """Every sample the page offers, in a fixed order (an audit's images first)."""
    return ((audit_samples(audit) if audit else []) + _photos() + _digits()
            + (_folder(images) if images else []))
