"""An audit run in a folder: the scan written in shards, resumable, split over torchrun ranks.

``run(checkpoint, data, out)`` scans ``data`` in shards of ``shard_size`` images
(``out/shards/NNNNN.npz``: the shard's maps, indices and rows, each written atomically). A run
that was interrupted starts again at the first missing shard; ``out/audit-options.json`` keeps
what the scan depends on (the checkpoint's SHA-256, the data, split, method, batch and shard
size), and a resume with different options is refused. Under torchrun every rank loads the
model and the data; rank 0 decides which shards are missing and broadcasts the list; in each
round rank k scans the round's k-th shard and ``gather_object`` brings the shards to rank 0,
which writes them (no shared disk needed), then clusters, confirms and writes the outputs
(:mod:`vitkit.audit.report`). Batches never cross a shard's edge, so the maps equal a
single-process run's whatever the number of ranks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch.distributed as dist
from PIL import Image

from vitkit.audit.analysis import DEFAULT_METHOD, Audit, check_method, finish, scan
from vitkit.checkpoints import load_model
from vitkit.data.datasets import Split, load_split
from vitkit.data.images import IMAGE_SUFFIXES, image_files, to_rgb
from vitkit.errors import ConfigError, DataError
from vitkit.models.cnn import CNN
from vitkit.train.distributed import setup
from vitkit.util.files import atomic_write
from vitkit.util.numbers import check_counts

log = logging.getLogger("vitkit")  # progress lines: the CLI shows them

OPTIONS = "audit-options.json"
SHARD_SIZE = 256
SCAN_KEYS = ("checkpoint_sha256", "data", "split", "method", "batch_size", "shard_size",
             "data_root", "images")  # what the written shards depend on


class FileSplit(Split):
    """Image files with their labels (-1 where the folder has no class sub-folders); a file
    that cannot be read raises with its path, and the audit makes it a row with the error."""

    def __getitem__(self, i: int):
        path = self.images[i]
        try:
            with Image.open(path) as f:
                return to_rgb(f), self.labels[i]
        except (OSError, ValueError, Image.DecompressionBombError) as err:
            raise DataError(f"cannot read {path}: {err}") from err


def folder_split(root: Path, split: str) -> Split:
    """Every image file under ``root`` (its ``train/`` or ``val/`` when it has them); the
    sub-folders are the classes, in sorted order (no sub-folders: no labels)."""
    if (root / "train").is_dir() or (root / "val").is_dir():
        if not (root / split).is_dir():
            raise DataError(f"{root} has no {split}/ folder; choose --split "
                            f"{'train' if split == 'val' else 'val'} or add {root}/{split}/")
        root = root / split
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and image_files(d))
    images, labels = [], []
    if classes:
        for label, name in enumerate(classes):
            found = image_files(root / name)
            images += found
            labels += [label] * len(found)
    else:
        images = image_files(root)
        labels = [-1] * len(images)
    if not images:
        raise DataError(f"{root} holds no image file ({', '.join(sorted(IMAGE_SUFFIXES))}); "
                        "point --data at a folder of images, or at class sub-folders of them")
    return FileSplit(images, labels, classes)


def audit_data(data: str, split: str, img_size: int, root: str = "data") -> Split:
    """The split to audit: a folder of images, or any data spec (``load_split``)."""
    path = Path(data).expanduser()
    if path.is_dir():
        return folder_split(path, split)
    if path.exists():
        raise DataError(f"--data {data} is a file; give a folder of images or a data spec")
    if (os.sep in data or data.startswith(".")) and not data.startswith("imagefolder:"):
        raise DataError(f"--data {data}: no such folder. Give a folder of images or a data "
                        "spec (vitkit list datasets)")
    return load_split(data, split, img_size, root=root)


class _Head(Sequence):
    """The first ``count`` items of a sequence, read from it when indexed."""

    def __init__(self, items: Sequence, count: int) -> None:
        self.items, self.count = items, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        if not -self.count <= i < self.count:
            raise IndexError(i)
        return self.items[i % self.count]


def _first(split: Split, count: int) -> Split:
    """The first ``count`` images of ``split`` (``--limit``)."""
    boxes = None if split.boxes is None else np.asarray(split.boxes)[:count]
    return type(split)(_Head(split.images, count), split.labels[:count], split.classes,
                       boxes=boxes, marked=[i for i in split.marked if i < count],
                       planted={k: [i for i in v if i < count] for k, v in split.planted.items()})


def fingerprint(source: str | os.PathLike) -> str:
    """SHA-256 of a checkpoint file (of every file, in order, for a folder); a hub id as is."""
    path = Path(source)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else (
        [path] if path.is_file() else [])
    if not files:
        return f"id:{source}"
    h = hashlib.sha256()
    for p in files:
        with open(p, "rb") as f:
            for block in iter(lambda f=f: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _shard_path(out: Path, s: int) -> Path:
    return out / "shards" / f"{s:05d}.npz"


def write_shard(out: Path, s: int, indices: list[int], rows: list[dict],
                maps: np.ndarray) -> None:
    def save(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, maps=maps, indices=np.asarray(indices, dtype=np.int64),
                     rows=np.asarray(json.dumps(rows)))

    atomic_write(_shard_path(out, s), save)


def read_shards(out: Path, count: int) -> tuple[list[dict], np.ndarray]:
    rows, maps = [], []
    for s in range(count):
        with np.load(_shard_path(out, s), allow_pickle=False) as z:
            rows += json.loads(str(z["rows"]))
            maps.append(z["maps"])
    return rows, np.concatenate(maps)


def _plan(out: Path, options: dict, shards: int) -> dict:
    """On rank 0: the shards still to scan, or the reason the folder cannot be resumed."""
    path = out / OPTIONS
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            return {"error": f"{path} cannot be read ({err}); remove it or choose another --out"}
        changed = [k for k in SCAN_KEYS if old.get(k) != options[k]]
        if changed:
            was = ", ".join(f"{k} {old.get(k)!r} -> {options[k]!r}" for k in changed)
            return {"error": f"{out} holds an audit made with other options ({was}); resume "
                             "it with the same options, or choose another --out"}
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(options, indent=2) + "\n"))
    return {"todo": [s for s in range(shards) if not _shard_path(out, s).exists()]}


def _broadcast(obj, ctx):
    if ctx.world == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gather(obj, ctx) -> list:
    if ctx.world == 1:
        return [obj]
    box = [None] * ctx.world if ctx.main else None
    dist.gather_object(obj, box, dst=0)
    return box or []


class Progress:
    """``audit: 512/1000 images (51%), 85.2 images/s, ETA 6 s`` lines on stderr."""

    def __init__(self, total: int, done: int, say: Callable[[str], None],
                 label: str = "audit") -> None:
        self.total, self.start_done, self.say, self.label = total, done, say, label
        self.t0 = time.perf_counter()

    def __call__(self, done: int) -> None:
        rate = (done - self.start_done) / max(time.perf_counter() - self.t0, 1e-9)
        eta = (self.total - done) / rate if rate > 0 else float("nan")
        self.say(f"{self.label}: {done}/{self.total} images ({done / self.total:.0%}), "
                 f"{rate:.1f} images/s, ETA {eta:.0f} s")


def shard_indices(s: int, n: int, shard_size: int) -> range:
    """The rows of shard ``s`` when ``n`` rows are cut in shards of ``shard_size``."""
    return range(s * shard_size, min(n, (s + 1) * shard_size))


def resume_progress(n: int, todo: Sequence[int], shard_size: int, *, ctx,
                    say: Callable[[str], None],
                    out: Path, label: str = "audit", verb: str = "scanned"
                    ) -> tuple[int, Progress]:
    """A run of ``n`` rows with the shards ``todo`` left: (the rows already done, its progress
    line); a resume is said on rank 0."""
    done = n - sum(len(shard_indices(s, n, shard_size)) for s in todo)
    if ctx.main and done:
        say(f"{label}: resuming, {done} of {n} images already {verb} in {out}")
    return done, Progress(n, done, say, label=label)


def _stderr(line: str) -> None:
    log.info(line)


def no_head(checkpoint, data: str, model_name: str | None) -> str:
    """What to do with a backbone without a head: train a linear probe, then audit that."""
    named = f" --model {model_name}" if model_name else ""
    return (f"{checkpoint} is a backbone without a classification head (num_classes 0): the "
            "audit explains a classifier's predictions, and it has none. Train a probe first, "
            f"a linear head on the frozen backbone: `vitkit train --init {checkpoint}{named} "
            f"--freeze backbone --data {data} --out runs --name probe`, then audit its "
            f"checkpoint: `vitkit audit --checkpoint runs/probe/best.safetensors --data {data}`")


def run(checkpoint: str | os.PathLike, data: str, out: str | os.PathLike, *,
        split: str = "val", method: str = DEFAULT_METHOD, batch_size: int = 64,
        shard_size: int = SHARD_SIZE, max_clusters: int = 8, confirm_images: int = 200,
        seed: int = 0, data_root: str = "data", device: str = "auto", limit: int | None = None,
        model_name: str | None = None, say: Callable[[str], None] = _stderr) -> Audit | None:
    """Audit ``checkpoint`` on ``data`` into ``out`` (see the module); ``limit``: only the
    first images of the split; ``model_name``: the architecture of a bare state dict.
    Returns the audit on rank 0 (None on the other ranks). Raises ConfigError or DataError on
    bad input."""
    check_counts((("batch_size", batch_size), ("shard_size", shard_size),
                  ("max_clusters", max_clusters), ("confirm_images", confirm_images),
                  ("limit", 1 if limit is None else limit)))
    ctx = setup(device)
    model = load_model(checkpoint, model=model_name, verbose=False)
    if isinstance(model, CNN):
        raise ConfigError(f"{checkpoint} is a CNN; the audit explains a ViT classifier's "
                          "predictions: give a ViT checkpoint trained or fine-tuned with a head")
    if model.num_classes < 1:
        raise ConfigError(no_head(checkpoint, data, model_name))
    check_method(model, method)
    model.to(ctx.device).eval()
    data_split = audit_data(data, split, model.cfg.img_size[0], data_root)
    if data_split.classes and len(data_split.classes) != model.num_classes:
        raise DataError(f"the checkpoint has {model.num_classes} classes but {data} has "
                        f"{len(data_split.classes)}; audit it on the data it was trained for")
    if limit is not None and limit < len(data_split):
        data_split = _first(data_split, limit)
    out = Path(out)
    n = len(data_split)
    options = {"checkpoint": str(checkpoint), "checkpoint_sha256": fingerprint(checkpoint),
               "data": data, "split": split, "method": method, "batch_size": batch_size,
               "shard_size": shard_size, "data_root": data_root, "images": n,
               "max_clusters": max_clusters, "confirm_images": confirm_images, "seed": seed,
               "model": model_name}  # --model: `vitkit explore --audit DIR` loads it so
    shards = math.ceil(n / shard_size)
    plan = _broadcast(_plan(out, options, shards) if ctx.main else None, ctx)
    if "error" in plan:
        raise ConfigError(plan["error"])
    todo = plan["todo"]

    done, progress = resume_progress(n, todo, shard_size, ctx=ctx, say=say, out=out)
    for r in range(math.ceil(len(todo) / ctx.world)):
        k = r * ctx.world + ctx.rank
        payload = None
        if k < len(todo):
            s = todo[k]
            indices = list(shard_indices(s, n, shard_size))
            rows, maps = scan(model, data_split, indices, method, batch_size, ctx.device)
            payload = (s, indices, rows, maps)
        for item in _gather(payload, ctx):
            if item is not None:
                write_shard(out, *item)
                done += len(item[1])
        if ctx.main:
            progress(done)
    if not ctx.main:
        return None
    rows, maps = read_shards(out, shards)
    if not any(not r["error"] for r in rows):
        raise DataError(f"none of the {n} images of {data} could be read; the first error: "
                        f"{rows[0]['error']}")
    model.cpu()  # clustering and masking run on rank 0's CPU
    say(f"audit: clustering and confirming on {sum(not r['error'] for r in rows)} images")
    result = finish(model, data_split, Audit(method, rows, maps), max_clusters=max_clusters,
                    confirm_images=confirm_images, seed=seed)
    result.split = data_split
    return result


def read_options(out: str | os.PathLike) -> dict:
    return json.loads((Path(out) / OPTIONS).read_text())
