"""``vitkit predict CHECKPOINT IMAGE_OR_FOLDER...``: top-k classes for image files, as a table on
screen and, with ``--out``, a CSV or JSON file."""

from __future__ import annotations

import argparse
import csv
import json
import os
from pathlib import Path

import torch

from vitkit.checkpoints.io import atomic_write, load_model
from vitkit.data.datasets import IMAGE_SUFFIXES
from vitkit.data.images import load_image, preprocessing

NAME = "predict"
HELP = "top-k classes for image files or folders"
DESCRIPTION = "Top-k classes for each image; --out writes CSV or JSON."


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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint")
    p.add_argument("inputs", nargs="+", help="image files or folders")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--out", default=None, help="predictions.csv or predictions.json")


def run(args: argparse.Namespace) -> None:
    for r in predict(args.checkpoint, args.inputs, top_k=args.top_k, out=args.out):
        if "error" in r:
            print(f"{r['image']}: {r['error']}")
        else:
            best = ", ".join(f"{t['class']} {t['probability']:.3f}" for t in r["top"])
            print(f"{r['image']}: {best}")
    if args.out:
        print(f"wrote {args.out}")
