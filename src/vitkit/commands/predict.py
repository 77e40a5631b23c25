"""``vitkit predict CHECKPOINT IMAGE_OR_FOLDER...``: top-k classes for image files, as a table on
screen and, with ``--out``, a CSV or JSON file."""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path

import torch

from vitkit.checkpoints.io import atomic_write, load_model
from vitkit.data.images import find_images, load_image, preprocessing
from vitkit.errors import ImageError, VitkitError

NAME = "predict"
HELP = "top-k classes for image files or folders"
DESCRIPTION = "Top-k classes for each image; --out writes CSV or JSON."


@torch.no_grad()
def predict(checkpoint: str | os.PathLike, inputs: list[str | os.PathLike], top_k: int = 5,
            out: str | os.PathLike | None = None) -> list[dict]:
    """Top-k classes for each image file (folders are searched); unreadable files are
    reported with their error instead of stopping the run. ``out``: ``.csv`` or ``.json``."""
    if top_k < 1:
        raise VitkitError(f"--top-k must be 1 or more, got {top_k}")
    if out is not None and Path(out).suffix not in (".csv", ".json"):
        raise VitkitError(f"--out must end in .csv or .json, got {Path(out).name!r}")
    if out is not None and Path(out).is_dir():
        raise VitkitError(f"--out {out} is a folder; give a file name ending in .csv or .json")
    files = find_images(inputs)
    model = load_model(checkpoint)
    size, mean, std = preprocessing(model)
    names = model.cfg.extra.get("class_names") or [str(i) for i in range(model.num_classes)]
    rows = []
    for path in files:
        try:
            x, _ = load_image(path, size, mean, std)
        except ImageError as err:
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
    header = ["image"] + [f"{k}{i}" for i in range(1, top_k + 1) for k in ("class", "prob")]
    header.append("error")

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="", encoding="utf-8", errors="backslashreplace") as f:
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


def run(args: argparse.Namespace) -> int:
    rows = predict(args.checkpoint, args.inputs, top_k=args.top_k, out=args.out)
    for r in rows:
        if "error" in r:
            print(f"{r['image']}: skipped: {r['error']}", file=sys.stderr)
        else:
            best = ", ".join(f"{t['class']} {t['probability']:.3f}" for t in r["top"])
            print(f"{r['image']}: {best}")
    if args.out:
        print(f"wrote {args.out}")
    failed = sum("error" in r for r in rows)
    if failed == len(rows):
        print(f"vitkit predict: error: none of the {failed} images could be read",
              file=sys.stderr)
        return 2
    return 0
