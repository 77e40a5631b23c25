"""``vitkit eval`` and ``vitkit predict``: a checkpoint scored on a dataset, or run on files."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from vitkit.checkpoints.io import atomic_write, load_model
from vitkit.data.datasets import IMAGE_SUFFIXES, load_split
from vitkit.data.images import load_image, preprocessing
from vitkit.data.transforms import Transformed, eval_transform
from vitkit.explain import plot
from vitkit.train.trainer import evaluate


def evaluate_checkpoint(checkpoint: str | os.PathLike, data: str, split: str = "val",
                        out: str | os.PathLike | None = None, batch_size: int = 256,
                        **data_options) -> dict:
    """Top-1, top-5, per-class accuracy and the confusion matrix of ``checkpoint`` on a split.

    With ``out``, writes ``eval.json`` and ``confusion.png`` there.
    """
    model = load_model(checkpoint)
    (size, _), mean, std = preprocessing(model)
    ds = load_split(data, split, size, **data_options)
    if len(ds.classes) != model.num_classes:
        raise ValueError(f"the checkpoint has {model.num_classes} classes but {data} has "
                         f"{len(ds.classes)}; evaluate on the data it was trained for")
    loader = DataLoader(Transformed(ds, eval_transform(size, mean, std)), batch_size=batch_size)
    metrics = evaluate(model, loader, torch.device("cpu"), len(ds.classes))
    result = {"checkpoint": str(checkpoint), "data": data, "split": split, "images": len(ds),
              "top1": metrics["top1"], "top5": metrics["top5"],
              "per_class": dict(zip(ds.classes, metrics["per_class"], strict=True)),
              "confusion": metrics["confusion"].tolist()}
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "eval.json",
                     lambda tmp: tmp.write_text(json.dumps(result, indent=2) + "\n"))
        plot.save(plot.figure_confusion(metrics["confusion"], ds.classes,
                                        title=f"{Path(checkpoint).name} on {data} ({split})"),
                  out / "confusion.png")
    return result


def _image_files(inputs: list[str | os.PathLike]) -> list[Path]:
    files = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            files += sorted(f for f in p.rglob("*") if f.suffix.lower() in IMAGE_SUFFIXES)
        elif p.exists():
            files.append(p)
        else:
            raise ValueError(f"no such image or folder: {p}")
    if not files:
        raise ValueError(f"no images found in {', '.join(map(str, inputs))}")
    return files


@torch.no_grad()
def predict(checkpoint: str | os.PathLike, inputs: list[str | os.PathLike], top_k: int = 5,
            out: str | os.PathLike | None = None) -> list[dict]:
    """Top-k classes for each image file (folders are searched); unreadable files are
    reported with their error instead of stopping the run. ``out``: ``.csv`` or ``.json``."""
    model = load_model(checkpoint)
    size, mean, std = preprocessing(model)
    names = model.cfg.extra.get("class_names") or [str(i) for i in range(model.num_classes)]
    rows = []
    for path in _image_files(inputs):
        try:
            x, _ = load_image(path, size, mean, std)
        except ValueError as err:
            rows.append({"image": str(path), "error": str(err)})
            continue
        probs = model(x[None]).softmax(-1)[0]
        values, indices = probs.topk(min(top_k, len(probs)))
        rows.append({"image": str(path), "top": [
            {"class": names[i], "index": int(i), "probability": float(v)}
            for v, i in zip(values.tolist(), indices.tolist(), strict=True)]})
    if out is not None:
        _write_predictions(Path(out), rows, top_k)
    return rows


def _write_predictions(out: Path, rows: list[dict], top_k: int) -> None:
    if out.suffix == ".json":
        atomic_write(out, lambda tmp: tmp.write_text(json.dumps(rows, indent=2) + "\n"))
        return
    if out.suffix != ".csv":
        raise ValueError(f"--out must end in .csv or .json, got {out.name!r}")
    header = ["image"] + [f"{k}{i}" for i in range(1, top_k + 1) for k in ("class", "prob")]
    header.append("error")

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            for r in rows:
                cells = [r["image"]]
                for t in r.get("top", []):
                    cells += [t["class"], f"{t['probability']:.6f}"]
                cells += [""] * (len(header) - 1 - len(cells)) + [r.get("error", "")]
                w.writerow(cells)

    atomic_write(out, write)
